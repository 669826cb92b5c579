"""The rotation of rotary position embeddings (``rpr_mt.model.positions.rope``), half-split layout:
(x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), with x1, x2 the two halves of the last dim.

On float32 CPU tensors it is one pass of a C kernel (``csrc/rotary.c``) behind two checked torch custom ops:
``torch.ops.rpr_mt.rotary`` reads x through its strides (queries and keys are views of the fused projection) and
writes a new tensor stored head-major, the layout the native attention kernel reads in place; ``rotary_`` turns a
tensor in place (the native kernel un-rotates gradient chunks while they are in cache). Elsewhere, or without a C
compiler, two multiplies and two multiply-adds in torch. ``rotate`` is the differentiable rotation.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from rpr_mt.model.kernels import c_library

__all__ = ["angles", "rotate", "rotate_half_split", "rotate_half_split_"]


class _RotaryArgs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in ("batch", "heads", "len", "dim", "stride_b", "stride_h", "stride_l")] + [
        ("x", ctypes.c_void_p), ("cos", ctypes.c_void_p), ("sin", ctypes.c_void_p), ("out", ctypes.c_void_p),
        ("sign", ctypes.c_float),
    ] + [(n, ctypes.c_int64) for n in ("out_stride_b", "out_stride_h", "out_stride_l")]


def _library() -> ctypes.CDLL | None:
    lib = c_library.load("rotary")
    if lib is not None and not hasattr(lib, "_rpr_typed"):
        lib.rotary.argtypes = [ctypes.POINTER(_RotaryArgs)]
        lib.rotary.restype = None
        lib._rpr_typed = True
    return lib


def _check_operands(x: Tensor, cos: Tensor, sin: Tensor) -> None:
    if x.dim() != 4 or x.dtype != torch.float32 or x.device.type != "cpu" or (x.size(-1) > 1 and x.stride(-1) != 1):
        raise ValueError(f"x must be a float32 CPU tensor [B, H, L, d] with contiguous rows, got {x.dtype} "
                         f"{tuple(x.shape)} strides {x.stride()} on {x.device}")
    length, dim = x.shape[2:]
    if dim % 2:
        raise ValueError(f"x needs an even last dim, got {dim}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dtype != torch.float32 or t.device.type != "cpu" or tuple(t.shape) != (length, dim // 2) or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous float32 CPU tensor [{length}, {dim // 2}], got {t.dtype} "
                             f"{tuple(t.shape)} on {t.device}")


def _run(x: Tensor, cos: Tensor, sin: Tensor, inverse: bool, out: Tensor) -> None:
    if x.numel():
        args = _RotaryArgs(*x.shape, *x.stride()[:3], x.data_ptr(), cos.data_ptr(), sin.data_ptr(), out.data_ptr(),
                           -1.0 if inverse else 1.0, *out.stride()[:3])
        _library().rotary(ctypes.byref(args))


@torch.library.custom_op("rpr_mt::rotary", mutates_args=(), device_types="cpu")
def rotary(x: Tensor, cos: Tensor, sin: Tensor, inverse: bool) -> Tensor:
    """x [B, H, L, d] float32 (rows contiguous) rotated by the angles whose cos and sin are [L, d/2] (contiguous);
    ``inverse`` turns the other way. Returns a new tensor [B, H, L, d] stored head-major (``_head_major``)."""
    _check_operands(x, cos, sin)
    out = _head_major(x)
    _run(x, cos, sin, inverse, out)
    return out


@torch.library.custom_op("rpr_mt::rotary_", mutates_args=("x",), device_types="cpu")
def rotary_(x: Tensor, cos: Tensor, sin: Tensor, inverse: bool) -> None:
    """``rotary`` in place: x keeps its strides (each pair of a row is read before it is written)."""
    _check_operands(x, cos, sin)
    _run(x, cos, sin, inverse, x)


@rotary_.register_fake
def _(x: Tensor, cos: Tensor, sin: Tensor, inverse: bool) -> None:
    return None


@rotary.register_fake
def _(x: Tensor, cos: Tensor, sin: Tensor, inverse: bool) -> Tensor:
    return _head_major(x)


def _head_major(x: Tensor) -> Tensor:
    """An empty tensor shaped like x [B, H, L, d] whose storage is [H, B, L, d]: the layout the native attention
    kernels work in, so that they read the rotated queries and keys in place instead of copying them."""
    batch, heads, length, dim = x.shape
    return torch.empty(heads, batch, length, dim, dtype=x.dtype, device=x.device).transpose(0, 1)


def angles(positions: Tensor, dim: int, base: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin [L, d/2] of the angles p * base^(-2m/d) of ``positions`` [L], computed in float64, in ``dtype``."""
    if dim % 2:
        raise ValueError(f"rotary embeddings need an even head dimension, got {dim}")
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device) / dim)  # [d/2]
    theta = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return theta.cos().to(dtype), theta.sin().to(dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [..., L, d] turned by the angles of cos, sin [L, d/2], differentiable (the backward pass is the inverse
    rotation)."""
    return _Rotate.apply(x, cos, sin)


class _Rotate(torch.autograd.Function):
    """One pass over x (``rotate_half_split``) instead of the five of the plain expression and its autograd
    backward."""

    @staticmethod
    def forward(ctx, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(cos, sin)
        return rotate_half_split(x, cos, sin)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        cos, sin = ctx.saved_tensors
        return rotate_half_split(grad, cos, sin, inverse=True), None, None


def _kernel_ok(x: Tensor) -> bool:
    return (x.dim() == 4 and x.dtype == torch.float32 and x.device.type == "cpu" and x.stride(-1) == 1
            and _library() is not None)


def rotate_half_split_(x: Tensor, cos: Tensor, sin: Tensor, inverse: bool = False) -> Tensor:
    """``rotate_half_split`` in place; returns x."""
    if _kernel_ok(x):
        torch.ops.rpr_mt.rotary_(x, cos.contiguous(), sin.contiguous(), inverse)
        return x
    return x.copy_(rotate_half_split(x, cos, sin, inverse))


def rotate_half_split(x: Tensor, cos: Tensor, sin: Tensor, inverse: bool = False) -> Tensor:
    """x [..., L, d] turned by the angles of cos, sin [L, d/2] (in x's dtype), or back with ``inverse``; no autograd
    (``rotate`` is the differentiable rotation)."""
    if _kernel_ok(x):
        return torch.ops.rpr_mt.rotary(x, cos.contiguous(), sin.contiguous(), inverse)
    if inverse:
        sin = -sin
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    torch.mul(x1, cos, out=out[..., :half]).addcmul_(x2, sin, value=-1.0)
    torch.mul(x2, cos, out=out[..., half:]).addcmul_(x1, sin)
    return out
