"""Checks that need a CUDA device (marker ``gpu``; ``scripts/gpu_check.sh`` runs them): relation-aware attention on
the GPU in float32 and bfloat16 against a float64 CPU reference, through the fused Triton kernels and the torch path
(impl="fused", named: the CUDA default is the Triton kernel in bf16); cached decoding equal to full decoding on each
path; content attention through SDPA; the CUDA default policy. Skipped without CUDA.

The reference is the gather path in float64 on the CPU, which tests/model/test_attention.py checks against the loop
reference of tests/model/reference.py (the loop itself is too slow at these shapes). Shapes are the base model's
per-head ones (d = 64, k = 16) at lengths that are not multiples of the 64-wide tiles.
"""

from __future__ import annotations

import functools

import pytest
import torch

from rpr_mt.model.attention import KVCache, causal_mask
from rpr_mt.model.kernels import choose_impl, relative_attention
from rpr_mt.model.kernels.gather import relative_attention_gather
from rpr_mt.model.masks import as_4d, revive_dead_rows

from ..test_attention import make_inputs, make_layer, make_mask

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run scripts/gpu_check.sh there)"),
]

F64 = torch.float64


def triton_ready():
    triton_shaw = pytest.importorskip("rpr_mt.model.kernels.triton_shaw")
    if not triton_shaw.available(torch.empty(1, device="cuda")):
        pytest.skip(triton_shaw.unavailable_reason(torch.empty(1, device="cuda")))
    return triton_shaw


def run(inputs, device, dtype, impl, **kwargs):
    """Output and gradients (q, k, v, tables, bias) of relative_attention on copies of float64 CPU leaves."""
    leaves = [None if t is None else t.detach().to(device, dtype).requires_grad_() for t in inputs]
    bias = kwargs.pop("bias", None)
    if bias is not None:
        bias = bias.detach().to(device, dtype).requires_grad_()
    mask = kwargs.pop("attn_mask", None)
    out = relative_attention(*leaves, attn_mask=None if mask is None else mask.to(device), bias=bias, impl=impl,
                             **kwargs)
    live = [t for t in [*leaves, bias] if t is not None]
    grad_out = torch.randn(out.shape, dtype=F64, generator=torch.Generator().manual_seed(9)).to(device, dtype)
    return [out.detach().double().cpu()] + [g.double().cpu() for g in torch.autograd.grad(out, live, grad_out)]


def relative_error(actual, expected):
    return max(((a - e).norm() / e.norm().clamp_min(1e-12)).item() for a, e in zip(actual, expected))


# (name, B, H, L, k, offset, mask, per-head, K, V, bias)
CASES = [
    ("encoder-padding-head-KV", 2, 4, 100, 16, 0, "padding", True, True, True, False),
    ("decoder-causal+padding-shared-KV", 2, 4, 130, 8, 0, "causal+padding", False, True, True, False),
    ("cached-offset-K-only-bias", 2, 4, 37, 16, 60, "causal", True, True, False, True),
    ("V-only-dead-row", 2, 4, 70, 16, 0, "dead", True, False, True, False),
    ("k0-padding-head-KV", 2, 4, 100, 0, 0, "padding", True, True, True, False),  # buckets 0 and 2k are one
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_float32_and_bfloat16_match_the_float64_reference(case):
    triton_ready()
    _, batch, heads, length, clip, offset, mask_kind, per_head, use_key, use_value, with_bias = case
    q_len = length
    k_len = length + offset
    inputs = make_inputs(batch, heads, q_len, k_len, 64, clip, per_head, use_key, use_value, seed=3)
    mask = make_mask(mask_kind, batch, heads, q_len, k_len, offset)
    bias = torch.randn(heads, q_len, k_len, dtype=F64) if with_bias else None
    kwargs = dict(clip=clip, offset=offset, attn_mask=mask, bias=bias)
    expected = run(inputs, "cpu", F64, "gather", **dict(kwargs))
    # float32: tight (3xTF32 dots in the kernel, IEEE float32 matmuls in torch)
    for impl in ("triton", "fused"):
        actual = run(inputs, "cuda", torch.float32, impl, **dict(kwargs))
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a, e, atol=2e-4, rtol=2e-4, msg=lambda m: f"{impl} float32: {m}")
    # bfloat16: no worse than the torch path in bfloat16 (and within 2% in norm)
    kernel = relative_error(run(inputs, "cuda", torch.bfloat16, "triton", **dict(kwargs)), expected)
    torch_path = relative_error(run(inputs, "cuda", torch.bfloat16, "fused", **dict(kwargs)), expected)
    assert kernel <= max(2e-2, 1.5 * torch_path), (kernel, torch_path)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_serial_backward_matches_the_float64_reference(case, monkeypatch):
    """RPR_MT_TRITON_BACKWARD=serial (one program per (batch, head), buffers added over key blocks, barriers between
    their reads and writes): what the interpreter cannot check is that the barriers order the buffers on a GPU."""
    monkeypatch.setenv("RPR_MT_TRITON_BACKWARD", "serial")
    test_float32_and_bfloat16_match_the_float64_reference(case)


@pytest.mark.parametrize("backward", ["split", "serial"])
def test_seeded_dropout_on_the_gpu_replays_exactly(backward, monkeypatch):
    monkeypatch.setenv("RPR_MT_TRITON_BACKWARD", backward)
    triton_shaw = triton_ready()
    inputs = make_inputs(2, 4, 90, 90, 64, 16, True, True, True, seed=4)
    mask = make_mask("causal", 2, 4, 90, 90, 0)
    torch.manual_seed(5)
    actual = run(inputs, "cuda", torch.float32, "triton", clip=16, attn_mask=mask, dropout_p=0.1)
    torch.manual_seed(5)
    keep = triton_shaw.dropout_keep_mask(triton_shaw.draw_seed(), (2, 4, 90, 90), 0.1, "cuda").cpu()
    assert abs(keep.float().mean().item() - 0.9) < 0.01
    leaves = [t.detach().requires_grad_() for t in inputs]
    full_mask, dead = revive_dead_rows(as_4d(mask))
    out = relative_attention_gather(*leaves, None, full_mask, dead, keep, 16, 0, 0.1)
    grad_out = torch.randn(out.shape, dtype=F64, generator=torch.Generator().manual_seed(9))
    expected = [out.detach()] + list(torch.autograd.grad(out, leaves, grad_out))
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("impl", ["auto", "fused", "triton"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cached_decoding_equals_full_decoding(impl, precision, monkeypatch):
    if impl == "triton":
        triton_ready()
    if impl != "auto":  # every call on that path (auto: gather for few queries, else the CUDA default)
        import rpr_mt.model.positions.shaw as shaw

        monkeypatch.setattr(shaw, "relative_attention", functools.partial(shaw.relative_attention, impl=impl))
    layer = make_layer(clip=4).cuda()
    x = torch.randn(3, 24, 16, device="cuda")
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16")
    with torch.no_grad(), autocast:
        full = layer(x, attn_mask=causal_mask(24, 24, device="cuda"))
        cache, pieces = KVCache(), []
        for start in range(24):  # one query at a time, as beam search does
            pieces.append(layer(x[:, start : start + 1], attn_mask=None, cache=cache))
        stepped = torch.cat(pieces, dim=1)
        cache, pieces = KVCache(), []
        for start in range(0, 24, 5):  # several at a time
            n = min(5, 24 - start)
            mask = causal_mask(n, start + n, offset=start, device="cuda")
            pieces.append(layer(x[:, start : start + n], attn_mask=mask, cache=cache))
        chunked = torch.cat(pieces, dim=1)
    tol = 1e-5 if precision == "fp32" else 2e-2
    torch.testing.assert_close(stepped.float(), full.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(chunked.float(), full.float(), atol=tol, rtol=tol)


def test_content_attention_on_cuda_is_sdpa_and_exact():
    q, k, v, _, _ = make_inputs(2, 4, 77, 77, 64, 0, False, False, False, dtype=torch.float32, seed=6)
    cuda = [t.detach().cuda() for t in (q, k, v)]
    assert choose_impl(cuda[0], 77, tables=False, needs_grad=True) == "sdpa"
    mask = make_mask("padding", 2, 4, 77, 77, 0)
    out = relative_attention(*cuda, None, None, clip=None, attn_mask=mask.cuda())
    expected = relative_attention(q.double(), k.double(), v.double(), None, None, clip=None, attn_mask=mask,
                                  impl="gather")
    torch.testing.assert_close(out.double().cpu(), expected, atol=2e-4, rtol=2e-4)


def test_content_attention_on_cuda_runs_no_cudnn_kernel():
    """cuDNN attention builds an execution plan per new shape (a translation trainer meets hundreds): content
    attention must run flash or memory-efficient attention, masked or not, forward and backward, in bf16."""
    from torch.profiler import ProfilerActivity, profile

    names = []
    for length, masked in [(37, True), (41, False), (64, True)]:
        q, k, v = (torch.randn(3, 8, length, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        mask = make_mask("padding", 3, 8, length, length, 0).cuda() if masked else None
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            relative_attention(q, k, v, None, None, clip=None, attn_mask=mask).float().sum().backward()
            torch.cuda.synchronize()
        names += [event.name for event in prof.events()]
    assert any("attention" in name.lower() for name in names)  # the profile saw the attention calls
    assert not [name for name in names if "cudnn" in name.lower()]


def test_relative_attention_on_cuda_defaults_to_the_triton_kernel():
    # the CUDA default chosen by measurement (docs/benchmarks.md); one query (cached decoding) stays on gather
    triton_ready()
    q = torch.randn(2, 4, 64, 64, device="cuda", dtype=torch.bfloat16)
    expected = "triton" if torch.cuda.get_device_capability() >= (8, 0) else "fused"
    assert choose_impl(q, 64, tables=True, needs_grad=True) == expected
    assert choose_impl(q, 64, tables=True, needs_grad=False) == expected
    assert choose_impl(q.float(), 64, tables=True, needs_grad=True) == "fused"  # float32: not measured, torch path
    assert choose_impl(q[:, :, :1], 64, tables=True, needs_grad=False) == "gather"


def test_lengths_and_dropout_seeds_compile_each_kernel_once():
    """A trainer meets lengths 20-100 and draws a dropout seed per call: after one forward+backward, further lengths
    (multiples of 16 or not) and seeds (divisible by 16 or not) must reuse the compiled kernels, not specialize new
    variants (which made the first epoch of a GPU run compile for tens of seconds)."""
    triton_shaw = triton_ready()
    if triton_shaw.compiled_variants() is None:
        pytest.skip("this Triton keeps its kernel caches where compiled_variants cannot count them")

    def step(length: int, seed: int, bias: bool) -> None:
        q, k, v, rel_k, rel_v = (t.detach().to("cuda", torch.bfloat16).requires_grad_() for t in
                                 make_inputs(3, 4, length, length, 64, 16, True, True, True, seed=length))
        mask = make_mask("padding", 3, 4, length, length, 0).cuda()
        full_mask, dead = revive_dead_rows(as_4d(mask))
        # a learned bias of every pair, per head (what Transformer-XL's bucket bias becomes): head stride Lq * Lk
        logit_bias = torch.randn(1, 4, length, length, device="cuda", dtype=torch.bfloat16).requires_grad_() \
            if bias else None
        out = triton_shaw.triton_relative_attention(q, k, v, rel_k, rel_v, logit_bias, full_mask, dead, 16, 0, 0.1,
                                                    seed=seed)
        out.float().sum().backward()

    step(37, 12345, False)
    step(37, 12345, True)
    before = triton_shaw.compiled_variants()
    for length, seed in [(48, 12345), (64, 32), (99, 1), (20, 2**29 + 16), (37, 0)]:
        step(length, seed, False)
        step(length, seed, True)
    torch.cuda.synchronize()
    assert triton_shaw.compiled_variants() == before


def test_direct_launches_take_a_new_variant_for_misaligned_tensors():
    """The kernels are relaunched through their compiled variants (``triton_launch.Launcher``), keyed by what Triton
    specializes on: q, k, v that start 4 bytes past a 16-byte boundary, between calls with aligned ones, must get a
    variant compiled without the alignment hint, and every call must still match the reference."""
    triton_shaw = triton_ready()
    from rpr_mt.model.kernels.triton_launch import direct_launch_supported

    if not direct_launch_supported(triton_shaw.triton):
        pytest.skip("this Triton (or RPR_MT_TRITON_LAUNCH=jit) launches every call through kernel[grid]")
    inputs = make_inputs(2, 4, 50, 50, 64, 16, True, True, True, seed=6)
    mask = make_mask("padding", 2, 4, 50, 50, 0)
    expected = run(inputs, "cpu", F64, "gather", clip=16, attn_mask=mask)

    def misaligned(t: torch.Tensor) -> torch.Tensor:
        flat = torch.empty(t.numel() + 1, dtype=torch.float32, device="cuda")
        out = flat[1:].view(t.shape)
        out.copy_(t)
        return out

    for shift in (False, True, False, True):
        leaves = [t.detach().to("cuda", torch.float32) for t in inputs]
        if shift:
            leaves[:3] = [misaligned(t) for t in leaves[:3]]
            assert all(t.data_ptr() % 16 != 0 for t in leaves[:3])
        leaves = [t.requires_grad_() for t in leaves]
        out = relative_attention(*leaves, clip=16, attn_mask=mask.cuda(), impl="triton")
        grad_out = torch.randn(out.shape, dtype=F64, generator=torch.Generator().manual_seed(9)).cuda().float()
        actual = [out.detach().double().cpu()] + [g.double().cpu() for g in torch.autograd.grad(out, leaves, grad_out)]
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a, e, atol=2e-4, rtol=2e-4, msg=lambda m: f"misaligned={shift}: {m}")
    for kernel in (triton_shaw._shaw_fwd, triton_shaw._shaw_bwd_dkdv, triton_shaw._shaw_bwd_dq):  # read q, k, v
        launcher = triton_shaw._LAUNCHERS[id(kernel)]
        assert launcher.direct and len(launcher.compiled) >= 2  # aligned and not


def test_under_bf16_autocast_the_kernels_take_float32_tables_and_return_float32_gradients():
    """The model's case: float32 parameters, bf16 autocast. The Triton path reads the float32 tables as they are
    (no cast kernels, gradients not rounded to bf16); its output and gradients must be as close to the float64
    reference as the torch path's, which casts the tables to bf16."""
    triton_ready()
    inputs = make_inputs(2, 4, 70, 70, 64, 16, True, True, True, seed=8)
    mask = make_mask("causal+padding", 2, 4, 70, 70, 0)
    expected = run(inputs, "cpu", F64, "gather", clip=16, attn_mask=mask)
    errors = {}
    for impl in ("triton", "fused"):
        leaves = [t.detach().to("cuda", torch.float32).requires_grad_() for t in inputs]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = relative_attention(*leaves, clip=16, attn_mask=mask.cuda(), impl=impl)
        assert out.dtype == torch.bfloat16
        grad_out = torch.randn(out.shape, dtype=F64, generator=torch.Generator().manual_seed(9)).cuda().bfloat16()
        grads = torch.autograd.grad(out, leaves, grad_out)
        assert all(g.dtype == torch.float32 for g in grads)
        errors[impl] = relative_error([out.detach().double().cpu()] + [g.double().cpu() for g in grads], expected)
    assert errors["triton"] <= max(2e-2, 1.5 * errors["fused"]), errors


def test_the_model_in_bf16_runs_its_prepared_masks_through_the_triton_kernels(monkeypatch):
    """Seq2Seq prepares each mask once per stack (masks.PreparedMask): on CUDA the key-padding mask always carries
    its dead-row indicator and the causal mask none. Under bf16 autocast, with padded sources and one empty source
    (dead rows everywhere it is attended from), the default path takes the Triton kernels, and its logits and every
    parameter's gradient are as close to float32 as the torch path's (RPR_MT_TRITON=0's)."""
    triton_shaw = triton_ready()
    from rpr_mt.config import ModelConfig
    from rpr_mt.model.kernels import dispatch
    from rpr_mt.model.transformer import Seq2Seq

    if not dispatch._triton_runs(torch.empty(1, 1, 1, 64, device="cuda", dtype=torch.bfloat16)):
        pytest.skip("the default policy does not take the Triton kernels on this GPU")
    torch.manual_seed(0)
    config = ModelConfig(d_model=128, n_heads=2, encoder_layers=2, decoder_layers=2, ff_dim=256, dropout=0.0,
                         positions="relative", max_positions=64, clip=16)
    model = Seq2Seq(config, vocab_size=50, pad_id=0, bos_id=2, eos_id=3).cuda()
    gen = torch.Generator().manual_seed(1)
    src = torch.randint(4, 50, (3, 30), generator=gen)
    src[0, 20:] = 0  # padded
    src[2] = 0  # empty: every query attending to it is a dead row
    tgt_in = torch.randint(4, 50, (3, 20), generator=gen)
    src, tgt_in = src.cuda(), tgt_in.cuda()
    weights = torch.randn(3, 20, 50, generator=gen).cuda()
    enc = model.encode(src)
    assert enc.key_mask is not None and enc.key_mask.dead is not None

    def logits_and_grads(bf16: bool) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            logits = model(src, tgt_in)
        (logits.float() * weights).sum().backward()
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in model.parameters()]
        return [logits.detach().double().cpu()] + [g.detach().double().cpu() for g in grads]

    calls = []
    real = triton_shaw.triton_relative_attention
    monkeypatch.setattr(triton_shaw, "triton_relative_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    expected = logits_and_grads(bf16=False)  # float32: the torch path
    assert not calls
    kernel = logits_and_grads(bf16=True)
    assert len(calls) == 4  # the self-attention of 2 encoder and 2 decoder layers (>= 8 queries each)
    assert all(torch.isfinite(t).all() for t in kernel)
    monkeypatch.setattr(dispatch, "_triton_runs", lambda q: False)
    torch_path = logits_and_grads(bf16=True)
    assert len(calls) == 4
    errors = relative_error(kernel, expected), relative_error(torch_path, expected)
    assert errors[0] <= max(2e-2, 1.5 * errors[1]), errors
