"""The rotation of rotary position embeddings (``rpr_mt.model.positions.rope``), half-split layout:
(x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), with x1, x2 the two halves of the last dim.

On float32 CPU tensors it is one pass of a C kernel (``csrc/rotary.c``, a checked torch custom op,
``torch.ops.rpr_mt.rotary``) that reads x through its strides (queries and keys are views of the fused projection);
elsewhere, or without a C compiler, two multiplies and two multiply-adds in torch. Both write a new contiguous
tensor.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from rpr_mt import native

__all__ = ["rotate_half_split"]


class _RotaryArgs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in ("batch", "heads", "len", "dim", "stride_b", "stride_h", "stride_l")] + [
        ("x", ctypes.c_void_p), ("cos", ctypes.c_void_p), ("sin", ctypes.c_void_p), ("out", ctypes.c_void_p),
        ("sign", ctypes.c_float),
    ]


def _library() -> ctypes.CDLL | None:
    lib = native.load("rotary")
    if lib is not None and not hasattr(lib, "_rpr_typed"):
        lib.rotary.argtypes = [ctypes.POINTER(_RotaryArgs)]
        lib.rotary.restype = None
        lib._rpr_typed = True
    return lib


@torch.library.custom_op("rpr_mt::rotary", mutates_args=(), device_types="cpu")
def rotary(x: Tensor, cos: Tensor, sin: Tensor, inverse: bool) -> Tensor:
    """x [B, H, L, d] float32 (rows contiguous) rotated by the angles whose cos and sin are [L, d/2] (contiguous);
    ``inverse`` turns the other way. Returns a new contiguous tensor."""
    if x.dim() != 4 or x.dtype != torch.float32 or x.device.type != "cpu" or (x.size(-1) > 1 and x.stride(-1) != 1):
        raise ValueError(f"x must be a float32 CPU tensor [B, H, L, d] with contiguous rows, got {x.dtype} "
                         f"{tuple(x.shape)} strides {x.stride()} on {x.device}")
    batch, heads, length, dim = x.shape
    if dim % 2:
        raise ValueError(f"x needs an even last dim, got {dim}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dtype != torch.float32 or t.device.type != "cpu" or tuple(t.shape) != (length, dim // 2) or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous float32 CPU tensor [{length}, {dim // 2}], got {t.dtype} "
                             f"{tuple(t.shape)} on {t.device}")
    out = torch.empty(x.shape, dtype=x.dtype)
    if x.numel():
        args = _RotaryArgs(batch, heads, length, dim, *x.stride()[:3], x.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                           out.data_ptr(), -1.0 if inverse else 1.0)
        _library().rotary(ctypes.byref(args))
    return out


@rotary.register_fake
def _(x: Tensor, cos: Tensor, sin: Tensor, inverse: bool) -> Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def rotate_half_split(x: Tensor, cos: Tensor, sin: Tensor, inverse: bool = False) -> Tensor:
    """x [..., L, d] turned by the angles of cos, sin [L, d/2] (in x's dtype), or back with ``inverse``; no autograd
    (``rope._Rotate`` supplies the backward pass)."""
    if (x.dim() == 4 and x.dtype == torch.float32 and x.device.type == "cpu" and x.stride(-1) == 1
            and _library() is not None):
        return torch.ops.rpr_mt.rotary(x, cos.contiguous(), sin.contiguous(), inverse)
    if inverse:
        sin = -sin
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    torch.mul(x1, cos, out=out[..., :half]).addcmul_(x2, sin, value=-1.0)
    torch.mul(x2, cos, out=out[..., half:]).addcmul_(x1, sin)
    return out
