"""Relation-aware multi-head attention: Shaw, Uszkoreit & Vaswani (2018), "Self-Attention with Relative Position
Representations", Section 3.

For queries q_i, keys k_j and values v_j of one head (dimension d) the paper's equations (3)-(4) are

    e_ij = q_i . (k_j + a^K_ij) / sqrt(d)            a^K_ij = w^K[r_ij]
    z_i  = sum_j softmax_j(e_ij) (v_j + a^V_ij)      a^V_ij = w^V[r_ij]
    r_ij = clip(j - i, -k, k) + k                    (see ``positions.relative_position_index``)

with two *separate* learned tables w^K and w^V of 2k + 1 vectors each (never tied), per head ([H, 2k+1, d]) or
shared across heads ([2k+1, d]; the paper shares them, Section 3.3).

Efficient formulation (no per-pair [Lq, Lk, d] tensor, unlike tensor2tensor / OpenNMT-py). Two linear maps between
a bucket tensor A [.., Lq, 2k+1] and a pair tensor X [.., Lq, Lk] carry all the position terms:

    place(A)[i, j] = A[i, r_ij]                       (gather by bucket)
    fold(X)[i, r]  = sum_{j : r_ij = r} X[i, j]       (sum into buckets)

They are adjoints of each other (<place(A), X> = <A, fold(X)>), so each is the other's backward. Then

    logits = (q k^T + place(q w^K^T)) / sqrt(d)       the key term costs one [Lq, 2k+1] matmul
    z      = P v + fold(P) w^V                        the value term costs one [2k+1, d] matmul

and the extra memory is O(B H Lq Lk), like plain attention.

``relative_attention`` has two implementations, selected by ``impl``:

* ``"fused"`` (default): one custom autograd Function. It works through the batch in chunks of (batch, head)
  matrices sized to stay in the CPU cache, recomputes the probabilities in the backward pass instead of saving them
  (as FlashAttention does; only q, k, v, the output and the tiny [B, H, Lq, 2k+1] fold of the probabilities are
  saved), and writes every [Lq, Lk] intermediate in place into two reused chunk buffers. ``place`` is a broadcast
  fill (the two clipped regions are constant per row) plus a scatter of the 2k - 1 interior diagonals; ``fold`` is
  two row sums plus a gather of the interior diagonals. No full-size gather/scatter is needed. On CPU this matters
  because (a) a fresh multi-hundred-megabyte tensor costs page faults on every step and (b) torch's gather/scatter
  kernels are several times slower per element than broadcast arithmetic.
* ``"gather"``: the straightforward autograd composition (``torch.gather`` forward, ``scatter_add`` fold).
  Always available as a readable reference and fallback.

Masks use True = may attend. Masked logits are set to ``torch.finfo(dtype).min`` (never -inf, which would overflow
half precision arithmetic into NaN), and rows with no allowed key ("dead" rows) return zeros with zero gradients:
they are temporarily unmasked so that softmax never sees an all-masked row, and their output is zeroed afterwards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rpr_mt.model.positions import relative_position_index

__all__ = ["KVCache", "MultiHeadAttention", "causal_mask", "relative_attention"]

# Per-buffer byte budget of one chunk. Two buffers of this size live at once; on CPU they should fit in the last
# level cache together with the chunk's q/k/v slices. Accelerators prefer few large kernels.
_CPU_CHUNK_BYTES = 4 << 20
_ACCEL_CHUNK_BYTES = 1 << 30


# ----------------------------------------------------------------------------------------------------------------------
# Masks
# ----------------------------------------------------------------------------------------------------------------------


def causal_mask(
    q_len: int, k_len: int, offset: int = 0, device: torch.device | str | None = None
) -> Tensor:
    """Boolean [q_len, k_len] mask, True = may attend: the query at absolute position offset + i may attend the
    keys j <= offset + i (keys sit at 0 .. k_len - 1). With ``offset = k_len - q_len`` this is the mask for
    ``q_len`` new tokens appended to a cache of ``offset`` positions."""
    query_pos = torch.arange(offset, offset + q_len, device=device)  # [Lq]
    key_pos = torch.arange(k_len, device=device)  # [Lk]
    return key_pos[None, :] <= query_pos[:, None]


def _as_4d(mask: Tensor) -> Tensor:
    if mask.dtype != torch.bool:
        raise TypeError(f"attn_mask must be boolean (True = may attend), got {mask.dtype}")
    if mask.dim() > 4:
        raise ValueError(f"attn_mask must have at most 4 dims, got shape {tuple(mask.shape)}")
    return mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))


def _revive_dead_rows(mask: Tensor) -> tuple[Tensor, Tensor | None]:
    """Return (mask with fully masked rows unmasked, dead-row indicator [.., Lq, 1] or None if there are none).

    Softmax of an all-masked row is meaningless (uniform, or NaN with -inf); unmasking such rows keeps every
    computation finite, and the caller zeroes their outputs (which also zeroes their gradients)."""
    dead = ~mask.any(dim=-1, keepdim=True)  # [B?, H?, Lq?, 1]
    if mask.device.type == "cpu" and not bool(dead.any()):  # the check would cost a device sync elsewhere
        return mask, None
    return mask | dead, dead


def _mask_bias(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Additive bias, 0 where allowed and finfo(dtype).min where masked (never -inf).

    Adding is an order of magnitude faster than masked_fill_ with a broadcast mask on CPU. The sum of the bias and
    a negative logit may round to -inf, which is harmless: no row is fully masked (see _revive_dead_rows), so the row
    maximum is finite and exp(-inf - max) = 0."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)


# ----------------------------------------------------------------------------------------------------------------------
# place / fold
# ----------------------------------------------------------------------------------------------------------------------


@dataclass
class _Geometry:
    """Row-wise layout of the 2k+1 relative-position buckets over an [Lq, Lk] score matrix (queries at offset..).

    For k >= 1, row i splits into: the low region j <= i + offset - k (bucket 0), the 2k - 1 interior diagonals
    j = i + offset - k + t for t = 1 .. 2k-1 (bucket t, present only where 0 <= j < Lk), and the high region
    j >= i + offset + k (bucket 2k). For k = 0 all of a row is bucket 0."""

    clip: int
    low: Tensor | None  # [Lq, Lk] float, 1 on the low region
    high: Tensor | None  # [Lq, Lk] float, 1 on the high region
    inner_index: Tensor | None  # [Lq, 2k-1] long, column of each interior diagonal (clamped into range)
    inner_valid: Tensor | None  # [Lq, 2k-1] float, 1 where that column exists

    @staticmethod
    def build(q_len: int, k_len: int, clip: int, offset: int, dtype: torch.dtype, device: torch.device) -> "_Geometry":
        if clip == 0:
            return _Geometry(0, None, None, None, None)
        query_pos = torch.arange(offset, offset + q_len, device=device)[:, None]  # [Lq, 1]
        distance = torch.arange(k_len, device=device)[None, :] - query_pos  # [Lq, Lk], j - i
        column = query_pos - clip + torch.arange(1, 2 * clip, device=device)[None, :]  # [Lq, 2k-1]
        valid = (column >= 0) & (column < k_len)
        return _Geometry(
            clip,
            (distance <= -clip).to(dtype),
            (distance >= clip).to(dtype),
            column.clamp(0, max(k_len - 1, 0)),
            valid.to(dtype),
        )

    def expand_index(self, shape: torch.Size) -> Tensor:
        return self.inner_index.expand(shape)


def _place_parts(buckets: Tensor, geo: _Geometry) -> tuple[Tensor, Tensor]:
    """Split place(A) - A[.., 0] into per-row pieces: (A[2k] - A[0]) [.., Lq, 1] for the high region and
    (A[t] - A[0]) [.., Lq, 2k-1] for the interior diagonals (0 where the diagonal leaves the matrix)."""
    first = buckets[..., :1]
    return buckets[..., -1:] - first, (buckets[..., 1:-1] - first).mul_(geo.inner_valid)


def _place_offdiag(out: Tensor, high_delta: Tensor, inner: Tensor, geo: _Geometry) -> Tensor:
    """out <- place(A) - A[.., 0] from the pieces of ``_place_parts``: one broadcast multiply (the high region)
    plus a scatter of only Lq (2k - 1) elements, several times faster on CPU than a full-size gather."""
    torch.mul(geo.high, high_delta, out=out)
    return out.scatter_add_(-1, geo.expand_index(inner.shape), inner)


def _fold_into(out: Tensor, x: Tensor, geo: _Geometry, scratch: Tensor, total: float | None) -> None:
    """out [.., Lq, 2k+1] <- fold(x) for x [.., Lq, Lk]: the low-region sum (masked row sum), the interior
    diagonals (a small gather) and the high region as the rest of the row total. ``total`` is the known row sum
    (1 for softmax rows, 0 for the gradient of softmax logits) or None to compute it. ``scratch`` is clobbered."""
    if geo.clip == 0:
        if total is None:
            torch.sum(x, -1, keepdim=True, out=out)
        else:
            out.fill_(total)
        return
    low, inner, high = out[..., :1], out[..., 1:-1], out[..., -1:]
    torch.sum(torch.mul(x, geo.low, out=scratch), -1, keepdim=True, out=low)
    torch.gather(x, -1, geo.expand_index(inner.shape), out=inner)
    inner.mul_(geo.inner_valid)
    torch.neg(low + inner.sum(-1, keepdim=True), out=high)
    high.add_(x.sum(-1, keepdim=True) if total is None else total)


def place(buckets: Tensor, k_len: int, clip: int, offset: int = 0) -> Tensor:
    """place(A)[.., i, j] = A[.., i, r_ij] with r_ij = clip(j - (i + offset), -k, k) + k.

    buckets: [.., Lq, 2k+1] -> [.., Lq, Lk]. A plain function (no autograd); it is the adjoint of ``fold``."""
    q_len = buckets.shape[-2]
    geo = _Geometry.build(q_len, k_len, clip, offset, buckets.dtype, buckets.device)
    out = buckets.new_empty(*buckets.shape[:-1], k_len)
    if clip == 0:
        return out.copy_(buckets.expand_as(out))
    _place_offdiag(out, *_place_parts(buckets, geo), geo)
    return out.add_(buckets[..., :1])


def fold(x: Tensor, clip: int, offset: int = 0) -> Tensor:
    """fold(X)[.., i, r] = sum_{j: r_ij = r} X[.., i, j], the adjoint of ``place``. x: [.., Lq, Lk] -> [.., Lq, 2k+1]."""
    geo = _Geometry.build(x.shape[-2], x.shape[-1], clip, offset, x.dtype, x.device)
    out = x.new_empty(*x.shape[:-1], 2 * clip + 1)
    _fold_into(out, x, geo, torch.empty_like(x), None)
    return out


# ----------------------------------------------------------------------------------------------------------------------
# Fused implementation
# ----------------------------------------------------------------------------------------------------------------------
#
# The fused path walks over one head at a time, in chunks of batch rows: q[:, h] is a [B, L, d] view with uniform
# strides whatever the layout of q (in MultiHeadAttention it is a slice of the fused qkv projection), so every
# matmul runs on views and nothing is copied into a head-split layout. Outputs and gradients are allocated as
# [B, L, H, d] and returned as [B, H, L, d] views, which is the layout MultiHeadAttention merges heads from.


def _chunks(heads: int, batch: int, matrix_bytes: int, budget: int) -> Iterator[tuple[int, slice]]:
    """(head, batch slice) blocks of [Lq, Lk] matrices of at most ``budget`` bytes (at least one matrix)."""
    step = max(1, min(batch, budget // max(matrix_bytes, 1)))
    for h in range(heads):
        for b in range(0, batch, step):
            yield h, slice(b, min(b + step, batch))


def _rows(t: Tensor | None, bs: slice, h: int) -> Tensor | None:
    """[b, ..] block of head h from a [B?, H?, ..] tensor whose batch/head dims may be broadcast (size 1)."""
    if t is None:
        return None
    return t[bs if t.size(0) > 1 else slice(None), h if t.size(1) > 1 else 0]


def _head_table(table: Tensor | None, h: int) -> Tensor | None:
    """The [2c+1, d] table used by head h: shared tables as they are, per-head tables sliced."""
    return table if table is None or table.dim() == 2 else table[h]


def _last_dim_contiguous(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _heads_last(shape: torch.Size, like: Tensor) -> Tensor:
    """Uninitialised [B, H, L, d] tensor stored as [B, L, H, d] (returned as a permuted view)."""
    batch, heads, length, dim = shape
    return torch.empty(batch, length, heads, dim, dtype=like.dtype, device=like.device).permute(0, 2, 1, 3)


def _softmax_(scores: Tensor) -> Tensor:
    """Softmax over the last dim, in place where that is known to be safe (CPU kernels read a row before writing)."""
    if scores.device.type == "cpu":
        return torch._softmax(scores, -1, False, out=scores)
    return torch.softmax(scores, -1)


class _Buffers:
    """Reused flat chunk buffers: on CPU, fresh multi-megabyte tensors cost page faults on every call."""

    def __init__(self, numel: int, dtype: torch.dtype, device: torch.device) -> None:
        self.numel, self.dtype, self.device = numel, dtype, device
        self.bufs: dict[str, Tensor] = {}

    def __call__(self, name: str, shape: tuple[int, ...]) -> Tensor:
        if name not in self.bufs:
            self.bufs[name] = torch.empty(self.numel, dtype=self.dtype, device=self.device)
        return self.bufs[name][: math.prod(shape)].view(shape)


def _scores_(
    out: Tensor,  # [b, Lq, Lk], overwritten with the probabilities
    q: Tensor,  # [b, Lq, d]
    k: Tensor,  # [b, Lk, d]
    key_buckets: Tensor | None,  # [b, Lq, 2c+1] = q . w^K / sqrt(d)
    bias: Tensor | None,  # broadcastable to out: 0 or finfo.min
    geo: _Geometry,
    scale: float,
) -> Tensor:
    """softmax(scale q k^T + place(q w^K^T) + bias), computed in place in ``out``.

    Softmax ignores constants added to a row, so place(A) - A[.., 0] (zero on the low region) stands in for
    place(A): one broadcast multiply for the high region and a small scatter for the 2k - 1 interior diagonals."""
    kt = k.transpose(-1, -2)
    if key_buckets is not None and geo.clip > 0:
        _place_offdiag(out, *_place_parts(key_buckets, geo), geo)
        if bias is not None:
            out.add_(bias)
    elif bias is not None:
        out.copy_(bias.expand_as(out))
    else:
        return _softmax_(torch.baddbmm(out, q, kt, beta=0, alpha=scale, out=out))
    return _softmax_(out.baddbmm_(q, kt, alpha=scale))


def _sum_bmm_tn(a: Tensor, b: Tensor) -> Tensor:
    """sum over the batch of a[i]^T @ b[i]: [n, L, r], [n, L, d] -> [r, d]."""
    if _mergeable(a) and _mergeable(b):  # one [r, n L] @ [n L, d] matmul on views
        return a.reshape(-1, a.shape[-1]).t() @ b.reshape(-1, b.shape[-1])
    return torch.bmm(a.transpose(1, 2), b).sum(0)


def _mergeable(x: Tensor) -> bool:
    """Whether the first two dims of a 3-d tensor can be merged without a copy."""
    return x.size(0) == 1 or x.stride(0) == x.stride(1) * x.size(1)


class _FusedRelativeAttention(torch.autograd.Function):
    """Chunked relation-aware attention with in-place intermediates (see module docstring). Inputs are validated,
    cast to one dtype and dead-row-revived by ``relative_attention``."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        q: Tensor,  # [B, H, Lq, d], any strides
        k: Tensor,  # [B, H, Lk, d]
        v: Tensor,  # [B, H, Lk, d]
        rel_k: Tensor | None,  # [2c+1, d] or [H, 2c+1, d]
        rel_v: Tensor | None,
        mask: Tensor | None,  # bool, 4-d, broadcastable to [B, H, Lq, Lk], no fully masked row
        dead: Tensor | None,  # bool [B?, H?, Lq?, 1]: rows to zero
        keep: Tensor | None,  # bool [B, H, Lq, Lk] dropout keep mask
        clip: int,
        offset: int,
        dropout_p: float,
        chunk_bytes: int,
        save_probs: bool,
    ) -> Tensor:
        q, k, v = _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v)
        batch, heads, q_len, dim = q.shape
        k_len = k.shape[2]
        dtype, device = q.dtype, q.device
        scale = dim**-0.5
        geo = _Geometry.build(q_len, k_len, clip, offset, dtype, device)
        buckets = 2 * clip + 1
        # A mask without batch or head extent (padding [B,1,1,Lk], causal [1,1,Lq,Lk]) becomes a bias once.
        bias = None if mask is None or (mask.size(0) > 1 and mask.size(1) > 1) else _mask_bias(mask, dtype)
        key_table = None if rel_k is None else rel_k * scale  # q . w^K / sqrt(d) in one small matmul
        key_buckets = None if rel_k is None else torch.empty(heads, batch, q_len, buckets, dtype=dtype, device=device)
        folded = None if rel_v is None else torch.empty(heads, batch, q_len, buckets, dtype=dtype, device=device)
        probs = torch.empty(heads, batch, q_len, k_len, dtype=dtype, device=device) if save_probs else None
        out = _heads_last(q.shape, q)  # [B, H, Lq, d]

        matrix_bytes = q_len * k_len * q.element_size()
        step = max(1, min(batch, chunk_bytes // max(matrix_bytes, 1)))
        bufs = _Buffers(step * q_len * k_len, dtype, device)
        for h, bs in _chunks(heads, batch, matrix_bytes, chunk_bytes):
            q_c, k_c, v_c, out_c = q[bs, h], k[bs, h], v[bs, h], out[bs, h]  # [b, L, d] views
            shape = (q_c.shape[0], q_len, k_len)
            a_c = None
            if key_buckets is not None:
                a_c = torch.matmul(q_c, _head_table(key_table, h).t(), out=key_buckets[h, bs])  # [b, Lq, 2c+1]
            chunk_bias = _rows(bias, bs, h) if bias is not None or mask is None else _mask_bias(_rows(mask, bs, h), dtype)
            p = _scores_(probs[h, bs] if save_probs else bufs("p", shape), q_c, k_c, a_c, chunk_bias, geo, scale)
            if keep is not None:  # dropped probabilities p * keep / (1 - p_drop)
                p = torch.mul(p, keep[bs, h], out=bufs("dropped", shape)).mul_(1.0 / (1.0 - dropout_p))
            torch.bmm(p, v_c, out=out_c)  # [b, Lq, d]
            if folded is not None:  # value term fold(P) w^V; rows of P sum to 1 unless dropped
                scratch = bufs("p" if keep is not None and not save_probs else "scratch", shape)
                f_c = folded[h, bs]
                _fold_into(f_c, p, geo, scratch, None if keep is not None else 1.0)
                out_c.add_(torch.matmul(f_c, _head_table(rel_v, h)))
        if dead is not None:
            out.masked_fill_(dead, 0)

        ctx.save_for_backward(q, k, v, rel_k, rel_v, out, folded, key_buckets, probs, mask, dead, keep)
        ctx.config = (clip, offset, dropout_p, chunk_bytes)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        q, k, v, rel_k, rel_v, out, folded, key_buckets, probs, mask, dead, keep = ctx.saved_tensors
        clip, offset, dropout_p, chunk_bytes = ctx.config
        batch, heads, q_len, dim = q.shape
        k_len = k.shape[2]
        dtype, device = q.dtype, q.device
        scale = dim**-0.5
        keep_scale = 1.0 / (1.0 - dropout_p)
        geo = _Geometry.build(q_len, k_len, clip, offset, dtype, device)
        bias = None if mask is None or (mask.size(0) > 1 and mask.size(1) > 1) else _mask_bias(mask, dtype)

        grad_out = _last_dim_contiguous(grad_out)
        if dead is not None:
            grad_out = grad_out.masked_fill(dead, 0)
        grad_q, grad_k, grad_v = _heads_last(q.shape, q), _heads_last(k.shape, k), _heads_last(v.shape, v)
        grad_rel_k = None if rel_k is None else torch.zeros_like(rel_k)
        grad_rel_v = None if rel_v is None else torch.zeros_like(rel_v)

        matrix_bytes = q_len * k_len * q.element_size()
        step = max(1, min(batch, chunk_bytes // max(matrix_bytes, 1)))
        bufs = _Buffers(step * q_len * k_len, dtype, device)
        for h, bs in _chunks(heads, batch, matrix_bytes, chunk_bytes):
            q_c, k_c, v_c, go_c = q[bs, h], k[bs, h], v[bs, h], grad_out[bs, h]  # [b, L, d] views
            shape = (q_c.shape[0], q_len, k_len)
            # FlashAttention's identity: sum_j P_ij dP_ij = dO_i . O_i (with the value term and dropout too).
            delta = (go_c * out[bs, h]).sum(-1, keepdim=True)  # [b, Lq, 1]
            if probs is not None:
                p = probs[h, bs]
            else:
                chunk_bias = _rows(bias, bs, h) if bias is not None or mask is None else _mask_bias(_rows(mask, bs, h), dtype)
                a_c = None if key_buckets is None else key_buckets[h, bs]
                p = _scores_(bufs("p", shape), q_c, k_c, a_c, chunk_bias, geo, scale)
            g = bufs("g", shape)
            if keep is not None:
                keep_c = keep[bs, h]
                p_used = torch.mul(p, keep_c, out=g).mul_(keep_scale)
            else:
                p_used = p
            torch.bmm(p_used.transpose(1, 2), go_c, out=grad_v[bs, h])
            if rel_v is not None:
                grad_rel_v_h = _sum_bmm_tn(folded[h, bs], go_c)
                if rel_v.dim() == 3:
                    grad_rel_v[h] += grad_rel_v_h
                else:
                    grad_rel_v += grad_rel_v_h

            # g <- dP - delta with dP = dO v^T + place(dO w^V^T), the gradient of the (dropped) probabilities.
            row = delta.neg() if keep is None else None  # per-row constant of g
            if rel_v is not None:
                grad_buckets = torch.matmul(go_c, _head_table(rel_v, h).t())  # [b, Lq, 2c+1]
                row = grad_buckets[..., :1] if row is None else row.add_(grad_buckets[..., :1])
                if clip > 0:
                    _place_offdiag(g, *_place_parts(grad_buckets, geo), geo).add_(row)
                else:
                    g.copy_(row.expand_as(g))
            elif row is not None:
                g.copy_(row.expand_as(g))
            if row is None:
                torch.baddbmm(g, go_c, v_c.transpose(1, 2), beta=0, out=g)
            else:
                g.baddbmm_(go_c, v_c.transpose(1, 2))
            if keep is not None:
                g.mul_(keep_c).mul_(keep_scale).sub_(delta)
            ds = g.mul_(p)  # softmax backward: dS = P * (dP - delta)
            gq_c, gk_c = grad_q[bs, h], grad_k[bs, h]
            torch.baddbmm(gq_c, ds, k_c, beta=0, alpha=scale, out=gq_c)
            torch.baddbmm(gk_c, ds.transpose(1, 2), q_c, beta=0, alpha=scale, out=gk_c)
            if rel_k is not None:  # rows of dS sum to 0 (softmax is shift invariant)
                fold_ds = torch.empty(shape[0], q_len, 2 * clip + 1, dtype=dtype, device=device)
                _fold_into(fold_ds, ds, geo, bufs("p" if probs is None else "scratch", shape), 0.0)
                gq_c.add_(torch.matmul(fold_ds, _head_table(rel_k, h)), alpha=scale)
                grad_rel_k_h = _sum_bmm_tn(fold_ds, q_c).mul_(scale)
                if rel_k.dim() == 3:
                    grad_rel_k[h] += grad_rel_k_h
                else:
                    grad_rel_k += grad_rel_k_h
        return (grad_q, grad_k, grad_v, grad_rel_k, grad_rel_v) + (None,) * 8


# Above this many bytes of probabilities the fused path recomputes them in the backward pass instead of saving
# them: on CPU, glibc serves allocations up to 32 MiB from its reusable heap but maps larger ones fresh on every
# call, and the page faults cost about as much as the recomputation.
_SAVE_PROBS_MAX_BYTES = {"cpu": 32 << 20}
_SAVE_PROBS_MAX_BYTES_DEFAULT = 1 << 30


# ----------------------------------------------------------------------------------------------------------------------
# Reference (gather) implementation and content-only attention
# ----------------------------------------------------------------------------------------------------------------------


def _relative_attention_gather(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rel_k: Tensor | None,
    rel_v: Tensor | None,
    mask: Tensor | None,
    dead: Tensor | None,
    keep: Tensor | None,
    clip: int,
    offset: int,
    dropout_p: float,
) -> Tensor:
    """Plain autograd composition: gather places the key term, scatter_add folds the value term."""
    batch, heads, q_len, dim = q.shape
    k_len = k.shape[2]
    index = relative_position_index(q_len, k_len, clip, offset, device=q.device).expand(batch, heads, q_len, k_len)
    scores = q @ k.transpose(-1, -2)  # [B, H, Lq, Lk]
    if rel_k is not None:
        scores = scores + torch.gather(q @ rel_k.transpose(-1, -2), -1, index)  # [B, H, Lq, 2c+1] -> [.., Lk]
    scores = scores * dim**-0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1)
    if keep is not None:
        probs = probs * keep / (1.0 - dropout_p)
    out = probs @ v  # [B, H, Lq, d]
    if rel_v is not None:
        folded = probs.new_zeros(batch, heads, q_len, 2 * clip + 1).scatter_add(-1, index, probs)
        out = out + folded @ rel_v
    if dead is not None:
        out = out.masked_fill(dead, 0)
    return out


def _content_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float) -> Tensor:
    """Attention without position terms: SDPA, or matmul-softmax-matmul where that measured faster (small CPU
    problems, where SDPA's per-call overhead dominates)."""
    dead = None
    if mask is not None:
        mask, dead = _revive_dead_rows(_as_4d(mask))
    q_len, k_len = q.shape[-2], k.shape[-2]
    if q.device.type == "cpu" and q_len * k_len <= _CPU_MATMUL_MAX_PAIRS and q.requires_grad:
        scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1)
        if dropout_p > 0:
            probs = F.dropout(probs, dropout_p)
        out = probs @ v
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    if dead is not None:
        out = out.masked_fill(dead, 0)
    return out


# Below this many (query, key) pairs per matrix the plain composition beat SDPA for forward+backward on CPU.
_CPU_MATMUL_MAX_PAIRS = 64 * 64


# ----------------------------------------------------------------------------------------------------------------------
# Public functional API
# ----------------------------------------------------------------------------------------------------------------------


def relative_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rel_k: Tensor | None,
    rel_v: Tensor | None,
    *,
    clip: int | None,
    attn_mask: Tensor | None = None,
    offset: int = 0,
    dropout_p: float = 0.0,
    impl: str = "fused",
    chunk_bytes: int | None = None,
    save_probs: bool | None = None,
) -> Tensor:
    """Relation-aware scaled dot-product attention, Shaw et al. (2018) equations (3)-(4).

        e_ij = q_i . (k_j + rel_k[r_ij]) / sqrt(d),  z_i = sum_j softmax_j(e_ij) (v_j + rel_v[r_ij]),
        r_ij = clip(j - (i + offset), -clip, clip) + clip.

    Args:
        q: [B, H, Lq, d] queries.
        k, v: [B, H, Lk, d] keys and values.
        rel_k, rel_v: relative tables, each None (term off), [2*clip+1, d] shared by all heads, or
            [H, 2*clip+1, d] per head. Separate tables: rel_v is never tied to rel_k.
        clip: maximum relative distance k >= 0 (ignored, may be None, when both tables are None).
        attn_mask: boolean, broadcastable to [B, H, Lq, Lk], True = may attend. Rows with no allowed key give
            zeros (and zero gradients).
        offset: absolute position of the first query; queries sit at offset .. offset + Lq - 1 and keys at
            0 .. Lk - 1 (cached decoding).
        dropout_p: dropout on the attention probabilities (pass 0 in eval).
        impl: "fused" (chunked custom autograd Function) or "gather" (plain autograd reference).
        chunk_bytes: per-buffer byte budget of the fused implementation's chunks (default: device dependent).
        save_probs: fused implementation only: keep the [B, H, Lq, Lk] probabilities for the backward pass (True)
            or recompute them there chunk by chunk (False, FlashAttention style: O(chunk) extra memory). Default:
            save up to 32 MiB on CPU (1 GiB elsewhere), recompute above.

    Returns:
        [B, H, Lq, d]. Under autocast the computation runs in the autocast dtype (like matmul); the softmax of a
        low-precision row is accumulated in float32 by torch's kernels.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be [B, H, L, d], got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"incompatible shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if rel_k is None and rel_v is None:
        return _content_attention(q, k, v, attn_mask, dropout_p)

    batch, heads, q_len, dim = q.shape
    k_len = k.shape[2]
    if clip is None or clip < 0:
        raise ValueError(f"clip must be an int >= 0 when a relative table is given, got {clip}")
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    for name, table in (("rel_k", rel_k), ("rel_v", rel_v)):
        if table is None:
            continue
        expected = [(2 * clip + 1, dim), (heads, 2 * clip + 1, dim)]
        if tuple(table.shape) not in expected:
            raise ValueError(f"{name} must be [2*clip+1, d] or [H, 2*clip+1, d] = {expected}, got {tuple(table.shape)}")
    if impl not in ("fused", "gather"):
        raise ValueError(f"impl must be 'fused' or 'gather', got {impl!r}")

    device_type = q.device.type
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else q.dtype
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    rel_k = None if rel_k is None else rel_k.to(dtype)
    rel_v = None if rel_v is None else rel_v.to(dtype)

    mask, dead = None, None
    if attn_mask is not None:
        mask, dead = _revive_dead_rows(_as_4d(attn_mask.to(q.device)))
    keep = None
    if dropout_p > 0:
        keep = torch.empty(batch, heads, q_len, k_len, dtype=torch.bool, device=q.device).bernoulli_(1.0 - dropout_p)

    with torch.autocast(device_type, enabled=False):
        if impl == "gather":
            return _relative_attention_gather(q, k, v, rel_k, rel_v, mask, dead, keep, clip, offset, dropout_p)
        if chunk_bytes is None:
            chunk_bytes = _CPU_CHUNK_BYTES if device_type == "cpu" else _ACCEL_CHUNK_BYTES
        if save_probs is None:
            limit = _SAVE_PROBS_MAX_BYTES.get(device_type, _SAVE_PROBS_MAX_BYTES_DEFAULT)
            save_probs = batch * heads * q_len * k_len * q.element_size() <= limit
        return _FusedRelativeAttention.apply(
            q, k, v, rel_k, rel_v, mask, dead, keep, clip, offset, dropout_p, chunk_bytes, save_probs
        )


# ----------------------------------------------------------------------------------------------------------------------
# Module
# ----------------------------------------------------------------------------------------------------------------------


@dataclass
class KVCache:
    """Projected keys/values kept between incremental decoding calls of one ``MultiHeadAttention``.

    Self-attention (``memory`` is None): every call appends its new keys/values ([B, H, Lnew, d_head]) and its
    queries sit at positions ``length .. length + Lq - 1``, where ``length`` is the number of cached positions
    before the call; several new tokens per call are fine (pass ``causal_mask(Lq, length + Lq, offset=length)``).

    Cross-attention (``memory`` given on the first call): the first call projects the memory and stores it, and
    ``static`` becomes True; later calls reuse it, whether ``memory`` is passed again (it is then ignored) or None.

    ``query_offset`` counts the queries seen so far (the position of the next query); for self-attention it
    equals ``length`` before each call.
    """

    k: Tensor | None = None  # [B, H, L, d_head]
    v: Tensor | None = None  # [B, H, L, d_head]
    static: bool = False
    query_offset: int = 0

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.size(2)

    def reorder(self, index: Tensor) -> "KVCache":
        """Select batch rows (beam-search back-pointers): row b becomes old row index[b]. In place; returns self."""
        if self.k is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)
        return self


class MultiHeadAttention(nn.Module):
    """Multi-head attention with optional relative position representations (Shaw et al., 2018).

    Args:
        d_model: model dimension; d_head = d_model / n_heads.
        n_heads: number of heads.
        dropout: dropout on the attention probabilities (training only).
        clip: maximum relative distance k; None = content-only attention (encoder-decoder attention, and the
            absolute / none position modes).
        use_key, use_value: enable the a^K (logit) and a^V (value) terms; each has its own table.
        share_across_heads: one [2k+1, d_head] table per term shared by all heads (the paper) instead of
            [H, 2k+1, d_head] per head.
        bias: biases in the projections.

    Parameters: ``in_proj_weight`` [3 d_model, d_model] (query, key, value projections stacked so that
    self-attention runs one matmul; cross-attention uses the query rows on the query and the key/value rows on the
    memory), ``in_proj_bias``, ``out_proj``, and ``rel_k`` / ``rel_v`` when enabled. Projections use Xavier-uniform
    per [d_model, d_model] block and zero biases; the relative tables use N(0, d_head^-1/2) so that q . a^K starts
    at the scale of q . k for unit-variance keys.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        *,
        clip: int | None = None,
        use_key: bool = True,
        use_value: bool = True,
        share_across_heads: bool = False,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if clip is not None and clip < 0:
            raise ValueError(f"clip must be >= 0 or None, got {clip}")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.dropout = dropout
        self.clip = clip
        self.in_proj_weight = nn.Parameter(torch.empty(3 * d_model, d_model))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * d_model)) if bias else None
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.rel_k: nn.Parameter | None = None
        self.rel_v: nn.Parameter | None = None
        if clip is not None:
            table_shape = (2 * clip + 1, self.d_head) if share_across_heads else (n_heads, 2 * clip + 1, self.d_head)
            if use_key:
                self.rel_k = nn.Parameter(torch.empty(table_shape))
            if use_value:
                self.rel_v = nn.Parameter(torch.empty(table_shape))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for block in self.in_proj_weight.detach().chunk(3, dim=0):
            nn.init.xavier_uniform_(block)
        nn.init.xavier_uniform_(self.out_proj.weight)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
            nn.init.zeros_(self.out_proj.bias)
        for table in (self.rel_k, self.rel_v):
            if table is not None:
                nn.init.normal_(table, std=self.d_head**-0.5)

    def extra_repr(self) -> str:
        shared = self.rel_k is not None and self.rel_k.dim() == 2 or self.rel_v is not None and self.rel_v.dim() == 2
        return (
            f"d_model={self.d_model}, n_heads={self.n_heads}, dropout={self.dropout}, clip={self.clip}, "
            f"key={self.rel_k is not None}, value={self.rel_v is not None}, shared={shared}"
        )

    def _heads(self, x: Tensor, parts: int) -> tuple[Tensor, ...]:
        """[B, L, parts * d_model] -> parts tensors [B, H, L, d_head]."""
        batch, length, _ = x.shape
        return x.view(batch, length, parts, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4).unbind(0)

    def forward(
        self,
        query: Tensor,
        memory: Tensor | None = None,
        *,
        attn_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """query [B, Lq, d_model]; memory None (self-attention) or [B, Lk, d_model] (cross-attention);
        attn_mask boolean broadcastable to [B, H, Lq, Lk], True = may attend (the caller builds padding/causal
        masks; with a cache, Lk counts the cached positions too). Returns [B, Lq, d_model]."""
        batch, q_len, _ = query.shape
        d = self.d_model
        cross = memory is not None or (cache is not None and cache.static)
        offset = 0 if cache is None else cache.query_offset
        if not cross:
            q, k, v = self._heads(F.linear(query, self.in_proj_weight, self.in_proj_bias), 3)
            if cache is not None:
                if cache.k is not None:
                    k = torch.cat([cache.k, k], dim=2)
                    v = torch.cat([cache.v, v], dim=2)
                    offset = cache.length
                cache.k, cache.v = k.contiguous(), v.contiguous()
        else:
            w_q, w_kv = self.in_proj_weight[:d], self.in_proj_weight[d:]
            b_q, b_kv = (None, None) if self.in_proj_bias is None else (self.in_proj_bias[:d], self.in_proj_bias[d:])
            (q,) = self._heads(F.linear(query, w_q, b_q), 1)
            if cache is not None and cache.k is not None:
                k, v = cache.k, cache.v
            else:
                if memory is None:
                    raise ValueError("cross-attention needs memory on the first call")
                k, v = self._heads(F.linear(memory, w_kv, b_kv), 2)
                if cache is not None:
                    cache.k, cache.v, cache.static = k.contiguous(), v.contiguous(), True
        if cache is not None:
            cache.query_offset = offset + q_len

        out = relative_attention(
            q,
            k,
            v,
            self.rel_k,
            self.rel_v,
            clip=self.clip,
            attn_mask=attn_mask,
            offset=offset,
            dropout_p=self.dropout if self.training else 0.0,
        )  # [B, H, Lq, d_head]
        return self.out_proj(out.transpose(1, 2).reshape(batch, q_len, d))
