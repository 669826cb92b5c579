"""dispatch: how content attention calls SDPA (its cuDNN backend left out, the caller's setting restored)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rpr_mt.model.kernels import content_attention, dispatch, native, relative_attention


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


needs_native = pytest.mark.skipif(not native.available(torch.empty(0)), reason="the C kernels need a C compiler")


def _shaw_inputs(dtype: torch.dtype):
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 9, 8, generator=gen).to(dtype).requires_grad_() for _ in range(3))
    rel_k, rel_v = (torch.randn(3, 5, 8, generator=gen).requires_grad_() for _ in range(2))  # float32 parameters
    mask = torch.ones(2, 1, 9, 9, dtype=torch.bool).tril()
    return q, k, v, rel_k, rel_v, mask


@needs_native
def test_cpu_bf16_autocast_computes_attention_in_float32_on_the_c_kernels():
    """Under CPU autocast the attention is the float32 C kernels' result on the bf16 activations (exactly), and the
    gradients return to the activations in bfloat16 and to the tables in float32."""
    q, k, v, rel_k, rel_v, mask = _shaw_inputs(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = relative_attention(q, k, v, rel_k, rel_v, clip=2, attn_mask=mask)
    assert out.dtype == torch.float32
    out.square().sum().backward()
    plain = [t.detach().float().requires_grad_() for t in (q, k, v)]
    tables = [t.detach().clone().requires_grad_() for t in (rel_k, rel_v)]
    expected = relative_attention(*plain, *tables, clip=2, attn_mask=mask, impl="native")
    expected.square().sum().backward()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    for low, high in zip((q, k, v), plain):
        assert low.grad.dtype == torch.bfloat16
        torch.testing.assert_close(low.grad, high.grad.to(torch.bfloat16), rtol=0, atol=0)
    for got, want in zip((rel_k, rel_v), tables):
        assert got.grad.dtype == torch.float32
        torch.testing.assert_close(got.grad, want.grad, rtol=0, atol=0)


@needs_native
def test_content_attention_under_cpu_autocast_is_float32_too():
    q, k, v, _, _, mask = _shaw_inputs(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = content_attention(q, k, v, attn_mask=mask)
    expected = content_attention(q.float(), k.float(), v.float(), attn_mask=mask, impl="native")
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_an_explicit_implementation_under_cpu_autocast_computes_in_the_autocast_dtype():
    """Only the automatic choice moves to float32; impl="fused" is the bf16 torch path it replaced."""
    q, k, v, rel_k, rel_v, mask = _shaw_inputs(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = relative_attention(q, k, v, rel_k, rel_v, clip=2, attn_mask=mask, impl="fused")
    assert out.dtype == torch.bfloat16
    reference = relative_attention(q, k, v, rel_k, rel_v, clip=2, attn_mask=mask, impl="gather")
    torch.testing.assert_close(out.float(), reference, atol=5e-2, rtol=5e-2)
