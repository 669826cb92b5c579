"""The rotation of rotary embeddings: the C kernel (float32 CPU) against the torch expression in float64, on the
strided views the model passes, forward and inverse, and the custom op's operand checks."""

from __future__ import annotations

import pytest
import torch

from rpr_mt.model.kernels import c_library
from rpr_mt.model.kernels import rotary as rotary_module
from rpr_mt.model.kernels.rotary import rotate_half_split

needs_compiler = pytest.mark.skipif(c_library._compiler() is None, reason="no C compiler")


def angles(length: int, dim: int, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    theta = torch.arange(offset, offset + length, dtype=torch.float64)[:, None] * inv_freq
    return theta.cos(), theta.sin()


def expected_rotation(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool) -> torch.Tensor:
    half = x.size(-1) // 2
    x1, x2 = x[..., :half].double(), x[..., half:].double()
    s = -sin if inverse else sin
    return torch.cat([x1 * cos - x2 * s, x2 * cos + x1 * s], -1)


@needs_compiler
@pytest.mark.parametrize("inverse", [False, True])
def test_c_kernel_matches_the_expression_on_strided_views(inverse: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    batch, length, heads, dim = 3, 7, 2, 8
    qkv = torch.randn(batch, length, 3, heads, dim, generator=gen)
    q = qkv.permute(2, 0, 3, 1, 4)[0]  # [B, H, L, d], a strided view as in MultiHeadAttention
    cos, sin = angles(length, dim, offset=5)
    out = rotate_half_split(q, cos.float(), sin.float(), inverse=inverse)
    assert out.shape == q.shape and out.transpose(0, 1).is_contiguous()  # stored head-major, as attention reads it
    torch.testing.assert_close(out.double(), expected_rotation(q, cos, sin, inverse), atol=1e-6, rtol=1e-6)
    assert rotary_module._library() is not None  # the kernel ran, not the fallback


@needs_compiler
def test_inverse_undoes_the_rotation_and_the_torch_fallback_agrees() -> None:
    x = torch.randn(2, 3, 5, 6)
    cos, sin = (t.float() for t in angles(5, 6))
    back = rotate_half_split(rotate_half_split(x, cos, sin), cos, sin, inverse=True)
    torch.testing.assert_close(back, x, atol=1e-6, rtol=1e-6)
    fallback = rotate_half_split(x.double(), cos.double(), sin.double())  # float64: the torch path
    torch.testing.assert_close(rotate_half_split(x, cos, sin).double(), fallback, atol=1e-6, rtol=1e-6)


@needs_compiler
def test_native_attention_reads_rotated_keys_in_place_and_matches_contiguous_inputs() -> None:
    """The head-major output is what the native kernel reads without a copy; the result and the gradients are
    those of the same values in the ordinary [B, H, L, d] layout."""
    from rpr_mt.model.kernels import content_attention

    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 9, 8, generator=gen) for _ in range(3))
    cos, sin = (t.float() for t in angles(9, 8))
    outs = []
    for layout in (lambda x: x, lambda x: x.contiguous()):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        qr, kr = (layout(rotate_half_split(x, cos, sin)) for x in leaves[:2])  # no autograd: rotated leaves below
        qr, kr = qr.detach().requires_grad_(), kr.detach().requires_grad_()
        out = content_attention(qr, kr, leaves[2], impl="native")
        out.backward(torch.ones_like(out))
        outs.append((out, qr.grad, kr.grad, leaves[2].grad))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@needs_compiler
def test_the_op_checks_its_operands() -> None:
    x = torch.randn(1, 2, 4, 6)
    cos, sin = (t.float() for t in angles(4, 6))
    with pytest.raises(ValueError, match="float32 CPU tensor"):
        torch.ops.rpr_mt.rotary(x.double(), cos, sin, False)
    with pytest.raises(ValueError, match="contiguous rows"):
        torch.ops.rpr_mt.rotary(x.transpose(-1, -2), cos, sin, False)
    with pytest.raises(ValueError, match="cos must be"):
        torch.ops.rpr_mt.rotary(x, cos[:3], sin, False)
    with pytest.raises(ValueError, match="even last dim"):
        torch.ops.rpr_mt.rotary(torch.randn(1, 1, 4, 5), cos, sin, False)


@needs_compiler
@pytest.mark.parametrize("impl", ["native", "fused", "gather"])
@pytest.mark.parametrize("case", ["encoder", "decoder-offset", "tables", "chunked", "bucket-dropout", "strided"])
def test_rotary_argument_equals_rotating_first(impl: str, case: str, monkeypatch) -> None:
    """relative_attention(..., rotary=) against the same call on q and k rotated beforehand: outputs and the
    gradients of q, k, v (and of the tables and bucket bias). The native path turns its copies and the gradient
    chunks; the others rotate first. Covers queries at an offset with a causal mask, Shaw tables, the chunk-by-chunk
    copies of large inputs, a bucket bias with attention dropout (the same keep mask in both calls), and queries
    whose rows are not contiguous (the kernel's torch fallback)."""
    from rpr_mt.model.kernels import native as native_module
    from rpr_mt.model.kernels import relative_attention
    from rpr_mt.model.kernels.rotary import rotate
    from rpr_mt.model.masks import causal_mask

    gen = torch.Generator().manual_seed(3)
    batch, heads, dim, clip = 3, 2, 8, 2
    q_len, k_len, offset = (6, 9, 3) if case == "decoder-offset" else (7, 7, 0)
    q = torch.randn(batch, heads, q_len, dim, generator=gen)
    if case == "strided":  # the same values, each row strided
        q = torch.randn(batch, heads, dim, q_len, generator=gen).transpose(-1, -2)
    k, v = (torch.randn(batch, heads, k_len, dim, generator=gen) for _ in range(2))
    with_tables = case in ("tables", "strided")
    tables = [torch.randn(heads, 2 * clip + 1, dim, generator=gen) for _ in range(2)] if with_tables else None
    bucket = torch.randn(heads, 2 * clip + 1, generator=gen) if case == "bucket-dropout" else None
    dropout_p = 0.3 if case == "bucket-dropout" else 0.0
    mask = causal_mask(q_len, k_len, offset) if case == "decoder-offset" else None
    chunk_bytes = None
    if case == "chunked":  # no whole copies, one matrix a chunk
        monkeypatch.setattr(native_module, "_WHOLE_COPY_MAX_BYTES", 0)
        chunk_bytes = 1
    cos, sin = (t.float() for t in angles(max(offset + q_len, k_len) + 2, dim))  # more rows than needed: sliced

    def run(rotate_inside: bool):
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]  # detach keeps q's strides; clone might not
        extra = ([] if tables is None else tables) + ([] if bucket is None else [bucket])
        extra = [t.clone().requires_grad_() for t in extra]
        table_leaves = extra[:2] if tables is not None else [None, None]
        a, b = leaves[:2]
        if not rotate_inside:
            a = rotate(a, cos[offset:offset + q_len], sin[offset:offset + q_len])
            b = rotate(b, cos[:k_len], sin[:k_len])
        torch.manual_seed(7)  # the same dropout keep mask in both calls
        out = relative_attention(
            a, b, leaves[2], *table_leaves, clip=clip if tables or bucket is not None else None, attn_mask=mask,
            bucket_bias=extra[-1] if bucket is not None else None, rotary=(cos, sin) if rotate_inside else None,
            offset=offset, dropout_p=dropout_p, impl=impl, chunk_bytes=chunk_bytes,
        )
        out.backward(torch.cos(out))  # a gradient that is not uniform
        return [out] + [x.grad for x in leaves + extra]

    for got, want in zip(run(True), run(False)):
        torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


@needs_compiler
def test_native_angles_changed_in_place_before_backward_are_refused() -> None:
    """The native Function saves the angles like any input: changing them before the backward pass raises, as it
    does on the paths that rotate first, instead of giving gradients for other angles."""
    from rpr_mt.model.kernels import content_attention

    q, k, v = (torch.randn(1, 2, 9, 8, requires_grad=True) for _ in range(3))
    cos, sin = (t.float() for t in angles(9, 8))
    out = content_attention(q, k, v, rotary=(cos, sin), impl="native")
    cos.mul_(0.5)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


@needs_compiler
def test_rope_layer_rotating_inside_the_native_kernel_equals_rotating_first() -> None:
    """The model's float32 path: Rotary.attend(rotated=False) turns q and k inside the native kernel; the same
    layer given rotated q and k (as with a cache) agrees, outputs and gradients, queries at an offset included."""
    from rpr_mt.config import config_from_dict
    from rpr_mt.model.masks import causal_mask
    from rpr_mt.model.positions.build import build_position_scheme

    cfg = config_from_dict({"model": {"d_model": 32, "n_heads": 4, "positions": "rope"}}).model
    layer = build_position_scheme(cfg).self_attention("decoder", 0)
    gen = torch.Generator().manual_seed(5)
    for q_len, k_len, offset in ((12, 12, 0), (9, 12, 3)):
        q = torch.randn(2, 4, q_len, 8, generator=gen)
        k, v = (torch.randn(2, 4, k_len, 8, generator=gen) for _ in range(2))
        mask = causal_mask(q_len, k_len, offset)
        results = []
        for rotated in (False, True):
            leaves = [x.clone().requires_grad_() for x in (q, k, v)]
            a, b = (layer.rotate(leaves[0], offset), layer.rotate(leaves[1], 0)) if rotated else leaves[:2]
            out = layer.attend(a, b, leaves[2], attn_mask=mask, offset=offset, dropout_p=0.0, rotated=rotated)
            out.backward(torch.sin(out))
            results.append([out] + [x.grad for x in leaves])
        for got, want in zip(*results):
            torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


def test_rotary_argument_is_checked() -> None:
    from rpr_mt.model.kernels import content_attention

    q = torch.randn(1, 1, 4, 6)
    cos, sin = (t.float() for t in angles(3, 6))
    with pytest.raises(ValueError, match="rotary must be"):
        content_attention(q, q, q, rotary=(cos, sin))  # 3 rows for 4 positions


@needs_compiler
def test_the_custom_ops_pass_torch_opcheck() -> None:
    """Schema, declared mutation and fake (meta) implementation agree with what the ops do: what torch.compile and
    the profiler rely on."""
    x = torch.randn(2, 3, 5, 6)
    cos, sin = (t.float() for t in angles(5, 6))
    torch.library.opcheck(torch.ops.rpr_mt.rotary.default, (x, cos, sin, False))
    torch.library.opcheck(torch.ops.rpr_mt.rotary_.default, (x.clone(), cos, sin, True))
