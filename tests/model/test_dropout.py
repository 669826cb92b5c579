"""The CPU dropout: the rate it claims, an unbiased expectation, torch's dropout contract and generator."""

import pytest
import torch

from rpr_mt.model.dropout import drop_rate, dropout, keep_mask


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_keep_mask_drops_at_the_stated_rate(p):
    torch.manual_seed(0)
    keep = keep_mask((257, 1031), p)  # odd sizes: the last int64 draw is only partly used
    assert keep.dtype == torch.bool and keep.shape == (257, 1031)
    n = keep.numel()
    dropped = 1.0 - keep.float().mean().item()
    assert drop_rate(p) == pytest.approx(p, abs=2**-16)
    # 5 standard deviations of a binomial proportion
    assert abs(dropped - drop_rate(p)) < 5 * (p * (1 - p) / n) ** 0.5


def test_keep_mask_lanes_are_independent():
    """The four 16-bit lanes of one draw decide four neighbours: their drops must not be correlated."""
    torch.manual_seed(1)
    keep = keep_mask((400_000,), 0.5).view(-1, 4).float()
    corr = torch.corrcoef(keep.T)
    off_diagonal = corr[~torch.eye(4, dtype=torch.bool)]
    assert off_diagonal.abs().max() < 0.01


def test_dropout_contract():
    x = torch.randn(64, 512, requires_grad=True)
    assert dropout(x, 0.3, training=False) is x
    assert dropout(x, 0.0, training=True) is x
    torch.manual_seed(2)
    y = dropout(x, 0.3, training=True)
    kept = y != 0
    # kept elements are scaled by exactly 1 / (1 - the real rate), dropped ones are zero
    torch.testing.assert_close(y[kept], x[kept] / (1 - drop_rate(0.3)))
    y.sum().backward()
    torch.testing.assert_close(x.grad, kept.float() / (1 - drop_rate(0.3)))
    with pytest.raises(ValueError):
        dropout(x, 1.0, training=True)


def test_dropout_is_unbiased_and_seeded():
    x = torch.ones(2000, 1000)
    torch.manual_seed(3)
    a = dropout(x, 0.1, training=True)
    assert a.mean().item() == pytest.approx(1.0, abs=0.003)
    torch.manual_seed(3)
    torch.testing.assert_close(dropout(x, 0.1, training=True), a)  # the global generator drives it


def test_dropout_keeps_dtype_under_bf16():
    x = torch.randn(8, 16, dtype=torch.bfloat16)
    assert dropout(x, 0.5, training=True).dtype == torch.bfloat16
