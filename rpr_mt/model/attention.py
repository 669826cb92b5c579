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

``relative_attention`` has three implementations, selected by ``impl``:

* ``"native"``: the fused algorithm below with its per-row work (place, mask, softmax, dropout, fold) done in one
  C pass per row (``native_attention.py``, kernels built on first use by ``rpr_mt/native.py``). The default for
  float32 on CPU where a C compiler is available; 15-30% faster than "fused" (benchmarks/bench_attention.py).

* ``"fused"``: one custom autograd Function (``_FusedRelativeAttention``) with a hand-written backward. It walks
  over chunks of whole [Lq, Lk] matrices (blocks of heads x batch rows, a few MiB each, so that they stay in the
  CPU cache) and writes every [Lq, Lk] intermediate in place into a few reused chunk buffers. ``place`` is done
  without any full-size gather: softmax ignores per-row constants, so the low clipped region (bucket 0) costs
  nothing, the high region (bucket 2k) is one broadcast multiply, and the 2k - 1 interior diagonals are written
  through a strided "band" view (row stride Lk + 1) of the score buffer. ``fold`` is a masked row sum for the low
  region, the band view for the interior and "row total minus the rest" for the high region, using the known row
  totals (1 for probabilities, 0 for the gradient of the logits). Table products (q w^K^T, fold(P) w^V, ...) are
  single bmm calls over the chunk's heads. The probabilities are saved for the backward pass, or recomputed
  there chunk by chunk (``save_probs=False``, FlashAttention style) to bound memory.
* ``"gather"``: the straightforward autograd composition (``torch.gather`` forward, ``scatter_add`` fold).
  Always available as a readable reference and fallback; also used for incremental decoding (few queries).

Measured on CPU (see benchmarks/bench_attention.py), torch's gather/scatter kernels cost several times more per
element than broadcast arithmetic, and every fresh multi-megabyte tensor costs page faults; the fused path avoids
both.

Masks use True = may attend. Masked logits get ``torch.finfo(dtype).min`` (masked_fill in the gather path, an
additive bias in the fused path) rather than -inf, and rows with no allowed key ("dead" rows) return zeros with
zero gradients: they are temporarily unmasked so that softmax never sees an all-masked row (which would give NaN
in the forward or backward pass), and their output is zeroed afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rpr_mt.model import native_attention
from rpr_mt.model.chunks import (
    ChunkBuffers,
    add_table_grad_,
    add_times_table_,
    block,
    bmm_into,
    chunks,
    flat,
    matrix_bytes,
    times_table_t,
)
from rpr_mt.model.dropout import drop_rate, dropout, keep_mask
from rpr_mt.model.positions import relative_position_index

__all__ = ["KVCache", "MultiHeadAttention", "causal_mask", "relative_attention"]

# Byte budget of one chunk buffer of the fused path. On CPU the few chunk buffers (scores, gradient, scratch and
# the chunk's q/k/v copies) should stay in the last-level cache; accelerators prefer few large kernels.
_CPU_CHUNK_BYTES = 8 << 20
_ACCEL_CHUNK_BYTES = 1 << 30
# The fused path saves the probabilities for the backward pass up to this size and recomputes them above it. On
# this project's CPUs saving was faster at every measured size (a fresh tensor's page faults cost less than the
# recomputation); recomputation bounds the memory instead.
_SAVE_PROBS_MAX_BYTES = 1 << 30
# Below this many queries (incremental decoding) "auto" uses the gather path: the fused path's per-chunk copies
# of the keys and values would cost more than the attention itself.
_FUSED_MIN_QUERIES = 8


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
    j >= i + offset + k (bucket 2k). For k = 0 all of a row is bucket 0.

    In rows i0 <= i < i1 all interior diagonals exist; there they are 2k - 1 consecutive elements, and across rows
    they form a strided "band" view (row stride Lk + 1) that is read and written without any index tensor. The few
    edge rows outside [i0, i1) (at most 2k - 2) use gather/scatter with clamped indices and a validity mask."""

    clip: int
    offset: int
    k_len: int
    low: Tensor | None = None  # [Lq, Lk] float, 1 on the low region
    high: Tensor | None = None  # [Lq, Lk] float, 1 on the high region
    band_rows: tuple[int, int] = (0, 0)  # [i0, i1)
    # per edge row block: (rows, column of each interior diagonal clamped into range [r, 2k-1], validity [r, 2k-1])
    edges: tuple[tuple[slice, Tensor, Tensor], ...] = ()

    @staticmethod
    def build(q_len: int, k_len: int, clip: int, offset: int, dtype: torch.dtype, device: torch.device) -> "_Geometry":
        if clip == 0:
            return _Geometry(0, offset, k_len)
        query_pos = torch.arange(offset, offset + q_len, device=device)[:, None]  # [Lq, 1]
        distance = torch.arange(k_len, device=device)[None, :] - query_pos  # [Lq, Lk], j - i
        i0 = min(max(0, clip - 1 - offset), q_len)
        i1 = max(min(q_len, k_len - clip - offset + 1), i0)
        edges = []
        for rows in (slice(0, i0), slice(i1, q_len)):
            if rows.stop > rows.start:
                column = query_pos[rows] - clip + torch.arange(1, 2 * clip, device=device)[None, :]  # [r, 2k-1]
                valid = ((column >= 0) & (column < k_len)).to(dtype)
                edges.append((rows, column.clamp(0, max(k_len - 1, 0)), valid))
        return _Geometry(
            clip, offset, k_len, (distance <= -clip).to(dtype), (distance >= clip).to(dtype), (i0, i1), tuple(edges)
        )

    def band(self, x: Tensor) -> Tensor:
        """[n, i1 - i0, 2k - 1] view of the interior diagonals of rows i0..i1 of a contiguous [n, Lq, Lk] x."""
        i0, i1 = self.band_rows
        start = x.storage_offset() + i0 * self.k_len + i0 + self.offset - self.clip + 1
        return x.as_strided((x.shape[0], i1 - i0, 2 * self.clip - 1), (x.stride(0), self.k_len + 1, 1), start)


def _place_parts(buckets: Tensor, geo: _Geometry) -> tuple[Tensor, Tensor]:
    """Split place(A) - A[.., 0] into per-row pieces: (A[2k] - A[0]) [.., Lq, 1] for the high region and
    (A[t] - A[0]) [.., Lq, 2k-1] for the interior diagonals."""
    first = buckets[..., :1]
    return buckets[..., -1:] - first, buckets[..., 1:-1] - first


def _place_offdiag(out: Tensor, high_delta: Tensor, inner: Tensor, geo: _Geometry) -> Tensor:
    """out [n, Lq, Lk] (contiguous) <- place(A) - A[.., 0] from the pieces of ``_place_parts``: a broadcast
    multiply for the high region plus the 2k - 1 interior diagonals, several times faster than a full gather."""
    torch.mul(geo.high, high_delta, out=out)
    i0, i1 = geo.band_rows
    if i1 > i0:
        geo.band(out).add_(inner[:, i0:i1])
    for rows, column, valid in geo.edges:  # diagonals leaving the matrix add 0 to a clamped column
        edge = inner[:, rows] * valid
        out[:, rows].scatter_add_(-1, column.expand(edge.shape), edge)
    return out


def _fold_into(out: Tensor, x: Tensor, geo: _Geometry, scratch: Tensor, total: float | None) -> None:
    """out [n, Lq, 2k+1] <- fold(x) for a contiguous x [n, Lq, Lk]: the low-region sum (a masked row sum), the
    interior diagonals (the band view), and the high region as the rest of the row total. ``total`` is the known
    row sum (1 for softmax rows, 0 for the gradient of softmax logits) or None to compute it. ``scratch`` (shaped
    like x) is clobbered."""
    if geo.clip == 0:
        if total is None:
            torch.sum(x, -1, keepdim=True, out=out)
        else:
            out.fill_(total)
        return
    low, inner, high = out[..., :1], out[..., 1:-1], out[..., -1:]
    torch.sum(torch.mul(x, geo.low, out=scratch), -1, keepdim=True, out=low)
    i0, i1 = geo.band_rows
    if i1 > i0:
        inner[:, i0:i1] = geo.band(x)
    for rows, column, valid in geo.edges:
        edge = inner[:, rows]
        torch.gather(x[:, rows], -1, column.expand(edge.shape), out=edge)
        edge.mul_(valid)
    torch.neg(low + inner.sum(-1, keepdim=True), out=high)
    high.add_(x.sum(-1, keepdim=True) if total is None else total)


def place(buckets: Tensor, k_len: int, clip: int, offset: int = 0) -> Tensor:
    """place(A)[.., i, j] = A[.., i, r_ij] with r_ij = clip(j - (i + offset), -k, k) + k.

    buckets: [.., Lq, 2k+1] -> [.., Lq, Lk]. A plain function (no autograd); it is the adjoint of ``fold``."""
    *lead, q_len, n_buckets = buckets.shape
    a = buckets.reshape(-1, q_len, n_buckets)
    out = a.new_empty(a.shape[0], q_len, k_len)
    if clip == 0:
        out.copy_(a.expand_as(out))
    else:
        geo = _Geometry.build(q_len, k_len, clip, offset, a.dtype, a.device)
        _place_offdiag(out, *_place_parts(a, geo), geo).add_(a[..., :1])
    return out.view(*lead, q_len, k_len)


def fold(x: Tensor, clip: int, offset: int = 0) -> Tensor:
    """fold(X)[.., i, r] = sum_{j: r_ij = r} X[.., i, j], the adjoint of ``place``.

    x: [.., Lq, Lk] -> [.., Lq, 2k+1]. A plain function (no autograd)."""
    *lead, q_len, k_len = x.shape
    x3 = x.reshape(-1, q_len, k_len).contiguous()
    geo = _Geometry.build(q_len, k_len, clip, offset, x.dtype, x.device)
    out = x.new_empty(x3.shape[0], q_len, 2 * clip + 1)
    _fold_into(out, x3, geo, torch.empty_like(x3), None)
    return out.view(*lead, q_len, 2 * clip + 1)


# ----------------------------------------------------------------------------------------------------------------------
# Fused implementation
# ----------------------------------------------------------------------------------------------------------------------
#
# The loop runs over chunks of whole [Lq, Lk] matrices (see rpr_mt/model/chunks.py); the per-head table products
# are single bmm calls over the chunk's heads. Outputs and gradients are contiguous [H, B, L, d] tensors returned
# as [B, H, L, d] views.


def _softmax_(scores: Tensor) -> Tensor:
    """Softmax over the last dim, written back into ``scores``. On CPU the kernel runs in place (it reads a row
    before writing it, and a second full-size buffer would cost page faults); elsewhere it goes through a
    temporary, since in-place aliasing is not guaranteed there."""
    if scores.device.type == "cpu":
        return torch._softmax(scores, -1, False, out=scores)
    return scores.copy_(torch.softmax(scores, -1))


class _Scores:
    """Attention probabilities of one chunk, softmax(qs k^T + place(qs w^K^T) + mask bias), computed in place.

    Softmax ignores constants added to a row, so place(A) - A[.., 0] (zero on the low region) stands in for
    place(A): a broadcast multiply for the high region plus the interior diagonals."""

    def __init__(self, rel_k: Tensor | None, geo: _Geometry, mask: Tensor | None, dtype: torch.dtype) -> None:
        self.rel_k = rel_k if geo.clip > 0 else None  # with k = 0 the key term is a per-row constant
        self.geo = geo
        self.mask = mask  # head-major [H?, B?, Lq?, Lk]
        self.dtype = dtype
        # A mask without head or batch extent (padding [B,1,1,Lk], causal [1,1,Lq,Lk]) becomes a bias once;
        # a full [B, H, Lq, Lk] mask is converted chunk by chunk.
        self.bias = None if mask is None or (mask.size(0) > 1 and mask.size(1) > 1) else _mask_bias(mask, dtype)

    def __call__(self, out: Tensor, qs: Tensor, k: Tensor, hs: slice, bs: slice) -> Tensor:
        """out: [h, b, Lq, Lk] buffer; qs (scaled queries), k: the chunk's contiguous [h, b, L, d] copies."""
        bias = block(self.bias, hs, bs)
        if bias is None and self.mask is not None:
            bias = _mask_bias(block(self.mask, hs, bs), self.dtype)
        kt = k.transpose(-1, -2)
        if self.rel_k is not None:
            key_buckets = times_table_t(qs, self.rel_k, hs)  # [h, b, Lq, 2c+1]
            _place_offdiag(flat(out), *(flat(x) for x in _place_parts(key_buckets, self.geo)), self.geo)
            if bias is not None:
                out.add_(bias)
        elif bias is not None:
            out.copy_(bias.expand_as(out))
        else:
            return _softmax_(bmm_into(qs, kt, out))
        flat(out).baddbmm_(flat(qs), flat(kt))
        return _softmax_(out)


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
        batch, heads, q_len, dim = q.shape
        k_len = k.shape[2]
        dtype, device = q.dtype, q.device
        scale = dim**-0.5
        q_h, k_h, v_h = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [H, B, L, d] views
        keep_h = None if keep is None else keep.transpose(0, 1)
        geo = _Geometry.build(q_len, k_len, clip, offset, dtype, device)
        scores = _Scores(rel_k, geo, None if mask is None else mask.transpose(0, 1), dtype)
        folded = None if rel_v is None else torch.empty(heads, batch, q_len, 2 * clip + 1, dtype=dtype, device=device)
        probs = torch.empty(heads, batch, q_len, k_len, dtype=dtype, device=device) if save_probs else None
        out = torch.empty(heads, batch, q_len, dim, dtype=dtype, device=device)  # [H, B, Lq, d]
        bufs = ChunkBuffers(dtype, device)

        for hs, bs in chunks(heads, batch, matrix_bytes(q_len, k_len, dim, q.element_size()), chunk_bytes):
            q_c = bufs.copy("q", q_h[hs, bs], scale)  # [h, b, Lq, d], scaled
            k_c, v_c = bufs.copy("k", k_h[hs, bs]), bufs.copy("v", v_h[hs, bs])
            shape = (*q_c.shape[:2], q_len, k_len)
            p = scores(probs[hs, bs] if save_probs else bufs("p", shape), q_c, k_c, hs, bs)  # [h, b, Lq, Lk]
            if keep_h is not None:  # dropped probabilities p * keep / (1 - p_drop)
                p = torch.mul(p, keep_h[hs, bs], out=bufs("dropped", shape)).mul_(1.0 / (1.0 - dropout_p))
            out_c = bmm_into(p, v_c, out[hs, bs])  # [h, b, Lq, d]
            if folded is not None:  # value term fold(P) w^V; rows of P sum to 1 unless dropped
                f_c = folded[hs, bs]
                scratch = bufs("p" if keep_h is not None and not save_probs else "scratch", shape)
                _fold_into(flat(f_c), flat(p), geo, flat(scratch), None if keep_h is not None else 1.0)
                add_times_table_(out_c, f_c, rel_v, hs)
        if dead is not None:
            out.masked_fill_(dead.transpose(0, 1), 0)

        ctx.save_for_backward(q, k, v, rel_k, rel_v, out, folded, probs, mask, dead, keep)
        ctx.config = (clip, offset, dropout_p, chunk_bytes)
        ctx.bufs = bufs  # reused by the backward pass: on CPU their pages are then already mapped
        return out.transpose(0, 1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        q, k, v, rel_k, rel_v, out, folded, probs, mask, dead, keep = ctx.saved_tensors
        clip, offset, dropout_p, chunk_bytes = ctx.config
        bufs = ctx.bufs
        batch, heads, q_len, dim = q.shape
        k_len = k.shape[2]
        dtype, device = q.dtype, q.device
        scale = dim**-0.5
        keep_scale = 1.0 / (1.0 - dropout_p)
        q_h, k_h, v_h, go_h = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), grad_out.transpose(0, 1)
        keep_h = None if keep is None else keep.transpose(0, 1)
        dead_h = None if dead is None else dead.transpose(0, 1)
        geo = _Geometry.build(q_len, k_len, clip, offset, dtype, device)
        mask_h = None if mask is None else mask.transpose(0, 1)
        scores = None if probs is not None else _Scores(rel_k, geo, mask_h, dtype)
        grad_q = torch.empty(heads, batch, q_len, dim, dtype=dtype, device=device)  # [H, B, Lq, d], head-major
        grad_k = torch.empty(heads, batch, k_len, dim, dtype=dtype, device=device)
        grad_v = torch.empty_like(grad_k)
        grad_rel_k = None if rel_k is None else torch.zeros_like(rel_k)
        grad_rel_v = None if rel_v is None else torch.zeros_like(rel_v)

        for hs, bs in chunks(heads, batch, matrix_bytes(q_len, k_len, dim, q.element_size()), chunk_bytes):
            q_c = bufs.copy("q", q_h[hs, bs], scale)
            k_c, v_c, go_c = bufs.copy("k", k_h[hs, bs]), bufs.copy("v", v_h[hs, bs]), bufs.copy("go", go_h[hs, bs])
            if dead_h is not None:
                go_c.masked_fill_(block(dead_h, hs, bs), 0)
            shape = (*q_c.shape[:2], q_len, k_len)
            g = bufs("g", shape)
            # FlashAttention's identity: sum_j P_ij dP_ij = dO_i . O_i (with the value term and dropout too).
            delta = torch.mul(go_c, out[hs, bs], out=bufs("product", tuple(go_c.shape))).sum(-1, keepdim=True)
            p = probs[hs, bs] if probs is not None else scores(bufs("p", shape), q_c, k_c, hs, bs)
            if keep_h is not None:
                keep_c = keep_h[hs, bs]
                bmm_into(torch.mul(p, keep_c, out=g).mul_(keep_scale).transpose(-1, -2), go_c, grad_v[hs, bs])
            else:
                bmm_into(p.transpose(-1, -2), go_c, grad_v[hs, bs])

            # g <- dP - delta, with dP = dO v^T + place(dO w^V^T) the gradient of the (dropped) probabilities;
            # the per-row constant of place() (bucket 0) and, without dropout, -delta form one row term.
            row = None if keep_h is not None else delta.neg()
            if rel_v is not None:
                add_table_grad_(grad_rel_v, folded[hs, bs], go_c, hs)
                grad_buckets = times_table_t(go_c, rel_v, hs)  # [h, b, Lq, 2c+1]
                row = grad_buckets[..., :1] if row is None else row.add_(grad_buckets[..., :1])
                if clip > 0:
                    _place_offdiag(flat(g), *(flat(x) for x in _place_parts(grad_buckets, geo)), geo)
                    g.add_(row)
                else:
                    g.copy_(row.expand_as(g))
            elif row is not None:
                g.copy_(row.expand_as(g))
            vt = v_c.transpose(-1, -2)
            if row is not None:
                flat(g).baddbmm_(flat(go_c), flat(vt))
            else:
                bmm_into(go_c, vt, g)
            if keep_h is not None:
                g.mul_(keep_c).mul_(keep_scale).sub_(delta)
            ds = g.mul_(p)  # softmax backward: dS = P * (dP - delta), the gradient of the logits
            gq_c = bmm_into(ds, k_c, grad_q[hs, bs])
            bmm_into(ds.transpose(-1, -2), q_c, grad_k[hs, bs])
            if rel_k is not None:  # rows of dS sum to 0 (softmax is shift invariant)
                fold_ds = bufs("fold", (*shape[:3], 2 * clip + 1))
                _fold_into(flat(fold_ds), flat(ds), geo, flat(bufs("p" if probs is None else "scratch", shape)), 0.0)
                add_times_table_(gq_c, fold_ds, rel_k, hs)
                add_table_grad_(grad_rel_k, fold_ds, q_c, hs)
        grad_q.mul_(scale)  # the chunk q copies were already scaled, so grad_k and the table grads are final
        return (grad_q.transpose(0, 1), grad_k.transpose(0, 1), grad_v.transpose(0, 1), grad_rel_k, grad_rel_v) + (
            None,
        ) * 8


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
    """Attention without position terms: SDPA, or where they measured faster (training on CPU), the native row
    kernels without tables or, failing those, matmul-softmax-matmul for small problems.

    In training on CPU (float32, no autocast) the native path ran at 0.57-0.66x of SDPA with attention dropout 0.1
    at L = 48-128 (SDPA's CPU kernels fall back to an unfused path with dropout) and 0.76-0.95x without dropout, in
    batches of 4,096 tokens; matmul-softmax-matmul was in between (benchmarks/bench_content_attention.py)."""
    dead = None
    if mask is not None:
        mask, dead = _revive_dead_rows(_as_4d(mask))
    q_len, k_len = q.shape[-2], k.shape[-2]
    if (
        k_len > 0
        and _needs_grad(q, k, v)
        and not torch.is_autocast_enabled(q.device.type)
        and native_attention.available(q)
        and k.dtype == v.dtype == q.dtype
    ):
        keep, rate = _attention_keep_mask(q, k_len, dropout_p)
        return native_attention.NativeRelativeAttention.apply(
            q, k, v, None, None, mask, dead, keep, 0, 0, rate, _CPU_CHUNK_BYTES, _fits_saved_probs(q, k_len)
        )
    if q.device.type == "cpu" and q_len * k_len <= _CPU_MATMUL_MAX_PAIRS and q.requires_grad:
        scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1)
        if dropout_p > 0:
            probs = dropout(probs, dropout_p, True)
        out = probs @ v
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    if dead is not None:
        out = out.masked_fill(dead, 0)
    return out


# Below this many (query, key) pairs per matrix the plain composition beat SDPA for forward+backward on CPU.
_CPU_MATMUL_MAX_PAIRS = 64 * 64


def _needs_grad(*tensors: Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _attention_keep_mask(q: Tensor, k_len: int, dropout_p: float) -> tuple[Tensor | None, float]:
    """Dropout keep mask [B, H, Lq, Lk] for the attention probabilities (None without dropout) and the rate it
    really has (``drop_rate``), for the 1 / (1 - p) scaling."""
    if dropout_p == 0:
        return None, 0.0
    return keep_mask((*q.shape[:3], k_len), dropout_p, q.device), drop_rate(dropout_p, q.device)


def _fits_saved_probs(q: Tensor, k_len: int) -> bool:
    """Whether the [B, H, Lq, Lk] probabilities are small enough to keep for the backward pass."""
    return q.shape[0] * q.shape[1] * q.shape[2] * k_len * q.element_size() <= _SAVE_PROBS_MAX_BYTES


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
    impl: str = "auto",
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
        impl: "native" (C row kernels; float32 on CPU), "fused" (chunked custom autograd Function in torch),
            "gather" (plain autograd reference), or "auto": gather for few queries (incremental decoding), where
            it has the least overhead, else native where it can run, else fused.
        chunk_bytes: native and fused: byte budget of one chunk buffer (default 8 MiB on CPU, to stay in cache; 1 GiB
            on accelerators).
        save_probs: native and fused: keep the [B, H, Lq, Lk] probabilities for the backward pass (True), or recompute
            them there chunk by chunk (False; FlashAttention style, O(chunk) extra memory, but slower). Default:
            save up to 1 GiB per call when a gradient is needed, else nothing.

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

    _, heads, q_len, dim = q.shape
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
    if impl not in ("auto", "native", "fused", "gather"):
        raise ValueError(f"impl must be 'auto', 'native', 'fused' or 'gather', got {impl!r}")
    if k_len == 0:  # nothing to attend to: every row is dead
        return q.new_zeros(q.shape)
    # Distances j - (i + offset) lie in [-(offset + Lq - 1), Lk - 1 - offset]. Buckets beyond the longest one are
    # never read, so a clip k above it equals that distance on the table's middle rows (the unused rows get zero
    # gradients either way). The paper's k = 64 and 256 on ~30-token sentences then do 2L-1 table products, not 2k+1.
    reach = max(offset + q_len - 1, k_len - 1 - offset)
    if clip > reach:
        middle = slice(clip - reach, clip + reach + 1)
        rel_k = None if rel_k is None else rel_k[..., middle, :]
        rel_v = None if rel_v is None else rel_v[..., middle, :]
        clip = reach

    device_type = q.device.type
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else q.dtype
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    rel_k = None if rel_k is None else rel_k.to(dtype)
    rel_v = None if rel_v is None else rel_v.to(dtype)
    if impl == "auto":
        impl = "gather" if q_len < _FUSED_MIN_QUERIES else "native" if native_attention.available(q) else "fused"
    elif impl == "native" and not native_attention.available(q):
        raise ValueError(f"impl='native' needs float32 CPU tensors and a C compiler (got {dtype} on {q.device})")

    mask, dead = None, None
    if attn_mask is not None:
        mask, dead = _revive_dead_rows(_as_4d(attn_mask.to(q.device)))
    keep, dropout_p = _attention_keep_mask(q, k_len, dropout_p)

    with torch.autocast(device_type, enabled=False):
        if impl == "gather":
            return _relative_attention_gather(q, k, v, rel_k, rel_v, mask, dead, keep, clip, offset, dropout_p)
        if chunk_bytes is None:
            chunk_bytes = _CPU_CHUNK_BYTES if device_type == "cpu" else _ACCEL_CHUNK_BYTES
        if save_probs is None:
            # inference (translation) keeps nothing for a backward pass
            save_probs = _needs_grad(q, k, v, rel_k, rel_v) and _fits_saved_probs(q, k_len)
        function = native_attention.NativeRelativeAttention if impl == "native" else _FusedRelativeAttention
        return function.apply(q, k, v, rel_k, rel_v, mask, dead, keep, clip, offset, dropout_p, chunk_bytes, save_probs)


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
