"""The rotation of rotary embeddings: the C kernel (float32 CPU) against the torch expression in float64, on the
strided views the model passes, forward and inverse, and the custom op's operand checks."""

from __future__ import annotations

import pytest
import torch

from rpr_mt import native
from rpr_mt.model.kernels import rotary as rotary_module
from rpr_mt.model.kernels.rotary import rotate_half_split

needs_compiler = pytest.mark.skipif(native._compiler() is None, reason="no C compiler")


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
    assert out.is_contiguous() and out.shape == q.shape
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
