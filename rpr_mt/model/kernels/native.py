"""Relation-aware attention (Shaw et al., 2018) with the row work in a C kernel: the fast path on CPU (float32).

The same chunked algorithm as ``torch_chunked.py``, with the same matrix products: q k^T, P v and their gradients
as batched matmuls per [Lq, Lk] matrix, and the table products q w^K^T, fold(P) w^V, ... as one matmul over all rows
of a chunk's heads. What changes is everything in between:

    forward   P = softmax(S + place(q w^K^T) + bias) with the mask, dropout P_d = P * keep / (1 - p), fold(P_d)
    backward  dS = P * (dP - delta), dP = (dO v^T + place(dO w^V^T)) * keep / (1 - p), delta = sum_j P dP, fold(dS)

is one pass over each row in C (``csrc/relative_rows.c``) instead of a dozen torch kernels, each a pass over the
[Lq, Lk] matrices (place, bias, softmax, dropout, the low/high masks of fold, ...).

The two row kernels are torch custom ops, ``torch.ops.rpr_mt.relative_rows_forward`` and ``..._backward``: they
check the shape, dtype, device and column contiguity of every operand and raise ``ValueError`` on a mismatch (a bad
call would otherwise read or write out of bounds), they show up by name in ``torch.profiler``, and
``torch.compile`` treats them as opaque mutating ops. Inside, the C code is called through ctypes (built by
``c_library.py`` on first use, in about a second, where torch's C++ extension build takes ~80 s here).
The autograd Function has the contract of the pure-torch one (``torch_chunked``): validated inputs, dead rows
revived, dropout keep mask drawn by the caller.
"""

from __future__ import annotations

import ctypes
from typing import Iterator, Optional

import torch
from torch import Tensor

from rpr_mt.model.kernels import c_library
from rpr_mt.model.kernels.rotary import rotate_half_split, rotate_half_split_
from rpr_mt.model.kernels.chunks import (
    ChunkBuffers,
    add_broadcast_grad_,
    add_table_grad_,
    add_times_table_,
    block,
    bmm_into,
    chunks,
    matrix_bytes,
    times_table_t,
)

__all__ = ["NativeRelativeAttention", "available", "relative_rows_backward", "relative_rows_forward"]

# Up to this size the whole of q, k, v is copied head-major once per call and the copies are kept for the
# backward pass (see _RowKernels.copies); above it, chunk by chunk in both passes, to bound memory.
_WHOLE_COPY_MAX_BYTES = 256 << 20


class _Operand(ctypes.Structure):
    _fields_ = [
        ("ptr", ctypes.c_void_p),
        ("stride_h", ctypes.c_int64),
        ("stride_b", ctypes.c_int64),
        ("stride_row", ctypes.c_int64),
    ]


_SHAPE = [(name, ctypes.c_int64) for name in ("heads", "batch", "q_len", "k_len", "clip", "offset")]


class _ForwardArgs(ctypes.Structure):
    _fields_ = _SHAPE + [("keep_scale", ctypes.c_float)] + [
        (n, _Operand) for n in ("s", "a", "mask", "keep", "bias", "p", "pd", "f")
    ]


class _BackwardArgs(ctypes.Structure):
    _fields_ = _SHAPE + [("keep_scale", ctypes.c_float)] + [
        (n, _Operand) for n in ("g", "b", "p", "keep", "ds", "fd", "pd")
    ]


def _library() -> ctypes.CDLL | None:
    lib = c_library.load("relative_rows")
    if lib is not None and not hasattr(lib, "_rpr_typed"):
        lib.relative_rows_forward.argtypes = [ctypes.POINTER(_ForwardArgs)]
        lib.relative_rows_backward.argtypes = [ctypes.POINTER(_BackwardArgs)]
        lib.relative_rows_forward.restype = lib.relative_rows_backward.restype = None
        lib._rpr_typed = True
    return lib


def built() -> bool:
    """True if the kernel library is built (or could be, now): the native path then runs float32 CPU tensors."""
    return _library() is not None


def available(q: Tensor) -> bool:
    """True if the native path can run on tensors like ``q`` (float32 on CPU, kernel library built)."""
    return q.device.type == "cpu" and q.dtype == torch.float32 and built()


# ----------------------------------------------------------------------------------------------------------------------
# The row kernels as checked custom ops
# ----------------------------------------------------------------------------------------------------------------------


def _check(name: str, t: Tensor | None, dtype: torch.dtype, shape: tuple[int, ...], broadcast: bool = False) -> None:
    """Raise ValueError unless ``t`` is a CPU tensor of ``dtype`` with contiguous columns whose shape is ``shape``
    (with ``broadcast``: each of the first three dims may also be 1; the columns never)."""
    if t is None:
        return
    if t.device.type != "cpu" or t.dtype != dtype:
        raise ValueError(f"{name} must be a {dtype} CPU tensor, got {t.dtype} on {t.device}")
    ok = t.dim() == 4 and t.shape[3] == shape[3] and all(
        t.shape[i] == shape[i] or (broadcast and t.shape[i] == 1) for i in range(3)
    )
    if not ok:
        raise ValueError(f"{name} must have shape {list(shape)}{' (or 1 in a leading dim)' if broadcast else ''}, "
                         f"got {list(t.shape)}")
    if t.shape[3] > 1 and t.stride(3) != 1:
        raise ValueError(f"{name} needs contiguous columns, got strides {t.stride()}")


def _operand(t: Tensor | None) -> _Operand:
    """A checked [h?, b?, rows?, cols] block (size-1 dims are broadcast) as a kernel operand."""
    if t is None:
        return _Operand(None, 0, 0, 0)
    return _Operand(t.data_ptr(), *[t.stride(i) if t.size(i) > 1 else 0 for i in range(3)])


def _check_common(x: Tensor, clip: int, offset: int, buckets: list[tuple[str, Tensor | None]]) -> tuple[int, ...]:
    if clip < 0 or offset < 0:
        raise ValueError(f"clip and offset must be >= 0, got {clip}, {offset}")
    shape = tuple(x.shape)
    _check("scores", x, torch.float32, shape)
    for name, t in buckets:
        _check(name, t, torch.float32, (*shape[:3], 2 * clip + 1))
    return shape


@torch.library.custom_op("rpr_mt::relative_rows_forward", mutates_args=("scores", "dropped", "folded"), device_types="cpu")
def relative_rows_forward(
    scores: Tensor,
    key_buckets: Optional[Tensor],
    mask: Optional[Tensor],
    keep: Optional[Tensor],
    bias: Optional[Tensor],
    dropped: Optional[Tensor],
    folded: Optional[Tensor],
    clip: int,
    offset: int,
    keep_scale: float,
) -> None:
    """Per row of scores [h, b, Lq, Lk] (the content logits, overwritten by the probabilities): add place(key
    buckets) and the bias, softmax over the keys the mask (uint8, 1 = may attend) allows; ``dropped`` <- the
    probabilities times keep * keep_scale; ``folded`` <- fold of the probabilities the output uses."""
    shape = _check_common(scores, clip, offset, [("key_buckets", key_buckets), ("folded", folded)])
    _check("mask", mask, torch.uint8, shape, broadcast=True)
    _check("keep", keep, torch.uint8, shape, broadcast=True)
    _check("bias", bias, torch.float32, shape, broadcast=True)
    _check("dropped", dropped, torch.float32, shape)
    if (keep is None) != (dropped is None):
        raise ValueError("keep and dropped go together")
    p = _operand(scores)
    args = _ForwardArgs(
        *shape, clip, offset, keep_scale,
        p, _operand(key_buckets), _operand(mask), _operand(keep), _operand(bias), p, _operand(dropped),
        _operand(folded),
    )  # fmt: skip
    _library().relative_rows_forward(ctypes.byref(args))


@relative_rows_forward.register_fake
def _(scores, key_buckets, mask, keep, bias, dropped, folded, clip, offset, keep_scale) -> None:
    return None


@torch.library.custom_op("rpr_mt::relative_rows_backward", mutates_args=("grad", "fold_grad", "dropped"), device_types="cpu")
def relative_rows_backward(
    grad: Tensor,
    value_buckets: Optional[Tensor],
    probs: Tensor,
    keep: Optional[Tensor],
    fold_grad: Optional[Tensor],
    dropped: Optional[Tensor],
    clip: int,
    offset: int,
    keep_scale: float,
) -> None:
    """Per row of grad [h, b, Lq, Lk] (dO . v_j, overwritten by dS, the gradient of the logits): add place(value
    buckets), apply dropout, the softmax backward against the saved (undropped) probs; ``fold_grad`` <- fold(dS);
    ``dropped`` <- probs * keep * keep_scale."""
    shape = _check_common(grad, clip, offset, [("value_buckets", value_buckets), ("fold_grad", fold_grad)])
    _check("probs", probs, torch.float32, shape)
    _check("keep", keep, torch.uint8, shape, broadcast=True)
    _check("dropped", dropped, torch.float32, shape)
    if (keep is None) != (dropped is None):
        raise ValueError("keep and dropped go together")
    g = _operand(grad)
    args = _BackwardArgs(
        *shape, clip, offset, keep_scale,
        g, _operand(value_buckets), _operand(probs), _operand(keep), g, _operand(fold_grad), _operand(dropped),
    )  # fmt: skip
    _library().relative_rows_backward(ctypes.byref(args))


@relative_rows_backward.register_fake
def _(grad, value_buckets, probs, keep, fold_grad, dropped, clip, offset, keep_scale) -> None:
    return None


def _bytes(t: Tensor | None) -> Tensor | None:
    """A bool tensor viewed as uint8 (same bytes), for the kernel."""
    return None if t is None else t.view(torch.uint8)


# ----------------------------------------------------------------------------------------------------------------------
# The autograd Function
# ----------------------------------------------------------------------------------------------------------------------


class NativeRelativeAttention(torch.autograd.Function):
    """Relation-aware attention with C row kernels (module docstring). Same arguments as the fused Function
    (q, k, v float32 on CPU)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx, q, k, v, rel_k, rel_v, bias, mask, dead, keep, clip: int, offset: int, dropout_p: float,
        chunk_bytes: int, save_probs: bool, bucket_bias: Tensor | None = None,
        rotary: tuple[Tensor, Tensor, Tensor, Tensor] | None = None,
    ) -> Tensor:
        batch, heads, q_len, dim = q.shape
        k_len = k.shape[2]
        if mask is not None and (mask.size(-1) != k_len or mask.stride(-1) != 1):
            mask = mask.expand(*mask.shape[:-1], k_len).contiguous()
        if bias is not None and (bias.size(-1) != k_len or bias.stride(-1) != 1):
            bias = bias.expand(*bias.shape[:-1], k_len).contiguous()
        ctx.config = (clip, offset, dropout_p, chunk_bytes)
        rows = _RowKernels(q, k, v, rel_k, bias, mask, keep, ctx.config, bucket_bias=bucket_bias, rotary=rotary)
        probs = torch.empty(heads, batch, q_len, k_len) if save_probs else None
        folded = None if rel_v is None else torch.empty(heads, batch, q_len, 2 * clip + 1)
        out = torch.empty(heads, batch, q_len, dim)  # head-major [H, B, Lq, d]
        for hs, bs in rows.chunks():
            q_c, k_c, v_c = rows.copies(hs, bs)
            p = probs[hs, bs] if save_probs else rows.bufs("p", (*q_c.shape[:3], k_len))
            f_c = None if folded is None else folded[hs, bs]
            p_used = rows.probabilities(p, q_c, k_c, hs, bs, f_c, dropped=keep is not None)
            out_c = bmm_into(p_used, v_c, out[hs, bs])
            if f_c is not None:
                add_times_table_(out_c, f_c, rel_v, hs)
        if dead is not None:
            out.masked_fill_(dead.transpose(0, 1), 0)
        # the angles too: saved tensors are checked for in-place changes before the backward pass uses them
        ctx.save_for_backward(q, k, v, rel_k, rel_v, bias, probs, folded, mask, dead, keep, bucket_bias,
                              *(rotary or ()))
        ctx.bufs = rows.bufs  # reused by the backward pass: on CPU their pages are then already mapped
        ctx.whole = rows.whole  # the head-major q, k, v copies, if made
        return out.transpose(0, 1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        q, k, v, rel_k, rel_v, bias, probs, folded, mask, dead, keep, bucket_bias, *rotary = ctx.saved_tensors
        rotary = tuple(rotary) or None
        clip, offset, dropout_p, _ = ctx.config
        batch, heads, q_len, dim = q.shape
        k_len = k.shape[2]
        rows = _RowKernels(q, k, v, rel_k, bias, mask, keep, ctx.config, ctx.bufs, ctx.whole, bucket_bias, rotary)
        bufs = rows.bufs
        grad_q = torch.empty(heads, batch, q_len, dim)  # head-major
        grad_k = torch.empty(heads, batch, k_len, dim)
        grad_v = torch.empty_like(grad_k)
        grad_rel_k = None if rel_k is None else torch.zeros_like(rel_k)
        grad_rel_v = None if rel_v is None else torch.zeros_like(rel_v)
        grad_bias_h = None if bias is None or not ctx.needs_input_grad[5] else torch.zeros_like(rows.bias_h)
        grad_bucket = None if bucket_bias is None or not ctx.needs_input_grad[14] else torch.zeros_like(bucket_bias)
        go_h = grad_out.transpose(0, 1)

        for hs, bs in rows.chunks():
            q_c, k_c, v_c = rows.copies(hs, bs)
            if dead is not None:  # in a copy: the incoming gradient is not ours to change
                go_c = bufs.copy("go", go_h[hs, bs]).masked_fill_(block(dead.transpose(0, 1), hs, bs), 0)
            else:
                go_c = bufs.contiguous("go", go_h[hs, bs])
            shape = (*q_c.shape[:3], k_len)
            if probs is not None:
                p = probs[hs, bs]
            else:
                p = rows.probabilities(bufs("p", shape), q_c, k_c, hs, bs, None, dropped=False)
            g = bmm_into(go_c, v_c.transpose(-1, -2), bufs("g", shape))  # dO v^T, becomes dS in place
            value_buckets = None if rel_v is None else times_table_t(go_c, rel_v, hs)  # dO w^V^T
            fold_ds = None if rel_k is None else bufs("fold", (*shape[:3], 2 * clip + 1))
            dropped = None if keep is None else bufs("dropped", shape)
            torch.ops.rpr_mt.relative_rows_backward(
                g, value_buckets, p, block(rows.keep_h, hs, bs), fold_ds, dropped, clip, offset,
                1.0 / (1.0 - dropout_p),
            )
            add_broadcast_grad_(grad_bias_h, g, hs, bs)
            bmm_into((p if dropped is None else dropped).transpose(-1, -2), go_c, grad_v[hs, bs])
            if rel_v is not None:
                add_table_grad_(grad_rel_v, folded[hs, bs], go_c, hs)
            # the logits are scale * q . (k + w^K): every gradient through q or of a product with q takes the scale
            gq_c = bmm_into(g, k_c, grad_q[hs, bs], alpha=rows.scale)
            gk_c = bmm_into(g.transpose(-1, -2), q_c, grad_k[hs, bs], alpha=rows.scale)
            if fold_ds is not None:
                add_times_table_(gq_c, fold_ds, rel_k, hs, alpha=rows.scale)
                add_table_grad_(grad_rel_k, fold_ds, q_c, hs, alpha=rows.scale)
                if grad_bucket is not None:  # the bucket term's gradient: dS summed per bucket, over rows
                    if grad_bucket.dim() == 1:
                        grad_bucket.add_(fold_ds.sum((0, 1, 2)))
                    else:
                        grad_bucket[hs].add_(fold_ds.sum((1, 2)))
            if rotary is not None:  # the gradients of the unrotated q and k, turned back while in cache
                cos_q, sin_q, cos_k, sin_k = rotary
                rotate_half_split_(gq_c, cos_q, sin_q, inverse=True)
                rotate_half_split_(gk_c, cos_k, sin_k, inverse=True)
        grad_bias = None if grad_bias_h is None else grad_bias_h.transpose(0, 1)
        grads = (grad_q.transpose(0, 1), grad_k.transpose(0, 1), grad_v.transpose(0, 1), grad_rel_k, grad_rel_v)
        return grads + (grad_bias,) + (None,) * 8 + (grad_bucket, None)


class _RowKernels:
    """What forward and backward share: the chunking, the chunk copies and the forward row kernel."""

    def __init__(
        self, q, k, v, rel_k, bias, mask, keep, config, bufs: ChunkBuffers | None = None, whole=None,
        bucket_bias: Tensor | None = None, rotary: tuple[Tensor, Tensor, Tensor, Tensor] | None = None,
    ) -> None:
        self.q_h, self.k_h, self.v_h = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [H, B, L, d] views
        self.rel_k = rel_k
        self.bucket_bias = bucket_bias
        self.rotary = rotary  # cos, sin [Lq, d/2] of the queries' angles, then those [Lk, d/2] of the keys
        self.bias_h = None if bias is None else bias.transpose(0, 1)
        self.mask_h = None if mask is None else _bytes(mask.transpose(0, 1))
        self.keep_h = None if keep is None else _bytes(keep.transpose(0, 1))
        self.clip, self.offset, self.dropout_p, self.chunk_bytes = config
        self.bufs = bufs or ChunkBuffers(q.dtype, q.device)
        self.whole: tuple[Tensor, Tensor, Tensor] | None = whole
        self.shape = (q.shape[1], q.shape[0], q.shape[2], k.shape[2], q.shape[3])  # H, B, Lq, Lk, d
        self.scale = q.shape[3] ** -0.5

    def chunks(self) -> Iterator[tuple[slice, slice]]:
        heads, batch, q_len, k_len, dim = self.shape
        return chunks(heads, batch, matrix_bytes(q_len, k_len, dim, 4), self.chunk_bytes)

    def copies(self, hs: slice, bs: slice) -> tuple[Tensor, Tensor, Tensor]:
        """The chunk's queries, keys and values as contiguous head-major blocks (the queries unscaled: the matmuls
        apply d^-1/2 as they write).

        Inputs already stored head-major are read in place. Otherwise, up to _WHOLE_COPY_MAX_BYTES, the whole of q,
        k, v is copied once, on the forward's first chunk, and the backward pass reuses those copies (``whole``,
        kept on the autograd context): the copies are memory bound and cost about as much as a matmul here. Above
        that, each chunk is copied into the chunk buffers. With ``rotary`` the copies of q and k are the rotated
        ones (RoPE): the rotation costs no pass of its own."""
        heads, batch, q_len, k_len, dim = self.shape
        if self.whole is None and 4 * heads * batch * (q_len + 2 * k_len) * dim <= _WHOLE_COPY_MAX_BYTES:
            if self.rotary is None:
                q_w, k_w = self.q_h.contiguous(), self.k_h.contiguous()
            else:  # the C rotation writes head-major storage, so .contiguous() copies nothing (it does after the
                # torch fallback, taken for inputs whose rows are not contiguous)
                cos_q, sin_q, cos_k, sin_k = self.rotary
                q_w = rotate_half_split(self.q_h.transpose(0, 1), cos_q, sin_q).transpose(0, 1).contiguous()
                k_w = rotate_half_split(self.k_h.transpose(0, 1), cos_k, sin_k).transpose(0, 1).contiguous()
            self.whole = (q_w, k_w, self.v_h.contiguous())
        if self.whole is not None:
            return tuple(x[hs, bs] for x in self.whole)  # contiguous blocks of [H, B, L, d]
        bufs = self.bufs
        if self.rotary is None:
            q_c, k_c = bufs.contiguous("q", self.q_h[hs, bs]), bufs.contiguous("k", self.k_h[hs, bs])
        else:
            cos_q, sin_q, cos_k, sin_k = self.rotary
            q_c = rotate_half_split_(bufs.copy("q", self.q_h[hs, bs]), cos_q, sin_q)
            k_c = rotate_half_split_(bufs.copy("k", self.k_h[hs, bs]), cos_k, sin_k)
        return q_c, k_c, bufs.contiguous("v", self.v_h[hs, bs])

    def probabilities(self, p: Tensor, q_c, k_c, hs, bs, folded: Tensor | None, dropped: bool) -> Tensor:
        """p [h, b, Lq, Lk] <- softmax(q_c k_c^T + place(q_c w^K^T) + bias + mask) (undropped); folded <- fold of
        the probabilities the output uses. Returns those: p, or with ``dropped`` the dropped ones (a chunk buffer)."""
        bmm_into(q_c, k_c.transpose(-1, -2), p, alpha=self.scale)
        key_buckets = None if self.rel_k is None else times_table_t(q_c, self.rel_k, hs, alpha=self.scale)
        if self.bucket_bias is not None:  # [R] or [H, R], on the bucket's logit like q . rel_k[r]
            b = self.bucket_bias
            key_buckets.add_(b if b.dim() == 1 else b[hs][:, None, None, :])
        p_dropped = self.bufs("dropped", tuple(p.shape)) if dropped else None
        torch.ops.rpr_mt.relative_rows_forward(
            p, key_buckets, block(self.mask_h, hs, bs), block(self.keep_h, hs, bs) if dropped else None,
            block(self.bias_h, hs, bs), p_dropped, folded, self.clip, self.offset, 1.0 / (1.0 - self.dropout_p),
        )  # fmt: skip
        return p if p_dropped is None else p_dropped
