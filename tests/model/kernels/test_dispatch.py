"""dispatch: how content attention calls SDPA (its cuDNN backend left out, the caller's setting restored)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rpr_mt.model.kernels import content_attention, dispatch


@pytest.fixture
def cudnn_flag():
    """The process-wide cuDNN-attention flag, restored after the test whatever it sets."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    yield
    torch.backends.cuda.enable_cudnn_sdp(before)


@pytest.fixture
def sdpa_calls(monkeypatch):
    """The cuDNN-attention flag as each SDPA call of dispatch saw it."""
    seen: list[bool] = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(dispatch.F, "scaled_dot_product_attention", spy)
    return seen


@pytest.mark.parametrize("enabled", [True, False])
def test_sdpa_runs_without_cudnn_attention_and_restores_the_callers_setting(cudnn_flag, sdpa_calls, enabled):
    """cuDNN attention builds an execution plan per new shape (the first epoch of a GPU run paid it at nearly every
    update); the call must not see it enabled, and the caller's setting must be as before afterwards."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=gen) for _ in range(3))
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])[:, None, None, :]
    torch.backends.cuda.enable_cudnn_sdp(enabled)
    out = content_attention(q, k, v, attn_mask=mask, impl="sdpa")
    assert sdpa_calls == [False]
    assert torch.backends.cuda.cudnn_sdp_enabled() is enabled
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_the_setting_is_restored_when_sdpa_raises(cudnn_flag, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(dispatch.F, "scaled_dot_product_attention", fail)
    torch.backends.cuda.enable_cudnn_sdp(True)
    q = torch.randn(1, 1, 2, 4)
    with pytest.raises(RuntimeError, match="out of memory"):
        content_attention(q, q, q, impl="sdpa")
    assert torch.backends.cuda.cudnn_sdp_enabled()
