"""Label-smoothed cross entropy against a direct computation of the smoothed target distribution."""

import torch

from rpr_mt.train.loss import label_smoothed_nll


def test_matches_explicit_smoothed_distribution():
    torch.manual_seed(0)
    logits = torch.randn(7, 11, dtype=torch.float64)
    target = torch.randint(0, 11, (7,))
    eps = 0.1
    q = torch.full((7, 11), eps / 11, dtype=torch.float64)
    q[torch.arange(7), target] += 1 - eps
    expected = -(q * torch.log_softmax(logits, -1)).sum()
    loss, nll = label_smoothed_nll(logits, target, eps)
    assert torch.allclose(loss.double(), expected)
    assert torch.allclose(nll.double(), torch.nn.functional.cross_entropy(logits, target, reduction="sum"))


def test_no_smoothing_is_cross_entropy_and_bf16_logits_are_upcast():
    logits = torch.randn(5, 9).bfloat16()
    target = torch.randint(0, 9, (5,))
    loss, nll = label_smoothed_nll(logits, target, 0.0)
    assert loss.dtype == torch.float32 and torch.allclose(loss, nll)
