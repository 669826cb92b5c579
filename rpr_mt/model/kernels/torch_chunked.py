"""Relation-aware attention (Shaw et al., 2018) as one custom autograd Function in pure torch: the fast path where the
C row kernels cannot run (no compiler, accelerators, low precision).

It walks over chunks of whole [Lq, Lk] matrices (blocks of heads x batch rows, a few MiB each, so that they stay in
the CPU cache; see chunks.py) and writes every [Lq, Lk] intermediate in place into a few reused chunk buffers. The
key term is placed with ``geometry.place_offdiag`` and the value term folded with ``geometry.fold_into``; table
products (q w^K^T, fold(P) w^V, ...) are single bmm calls over the chunk's heads. The probabilities are saved for
the backward pass, or recomputed there chunk by chunk (``save_probs=False``, FlashAttention style) to bound memory.
An optional float logit bias (T5, ALiBi, Transformer-XL's global content bias) is added before the softmax; its
gradient is the logits' gradient reduced to the bias's shape. Outputs and gradients are contiguous [H, B, L, d]
tensors returned as [B, H, L, d] views.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rpr_mt.model.kernels.chunks import (
    ChunkBuffers,
    add_broadcast_grad_,
    add_table_grad_,
    add_times_table_,
    block,
    bmm_into,
    chunks,
    flat,
    matrix_bytes,
    times_table_t,
)
from rpr_mt.model.kernels.geometry import Geometry, fold_into, place_offdiag, place_parts
from rpr_mt.model.masks import mask_bias

__all__ = ["ChunkedRelativeAttention"]



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

    def __init__(
        self, rel_k: Tensor | None, geo: Geometry, mask: Tensor | None, bias: Tensor | None, dtype: torch.dtype
    ) -> None:
        self.rel_k = rel_k if geo.clip > 0 else None  # with k = 0 the key term is a per-row constant
        self.geo = geo
        self.mask = mask  # head-major [H?, B?, Lq?, Lk]
        self.bias = bias  # head-major float [H?, B?, Lq?, Lk], or None
        self.dtype = dtype
        # A mask without head or batch extent (padding [B,1,1,Lk], causal [1,1,Lq,Lk]) becomes a bias once;
        # a full [B, H, Lq, Lk] mask is converted chunk by chunk.
        self.mask_bias = None if mask is None or (mask.size(0) > 1 and mask.size(1) > 1) else mask_bias(mask, dtype)

    def __call__(self, out: Tensor, qs: Tensor, k: Tensor, hs: slice, bs: slice) -> Tensor:
        """out: [h, b, Lq, Lk] buffer; qs (scaled queries), k: the chunk's contiguous [h, b, L, d] copies."""
        masked = block(self.mask_bias, hs, bs)
        if masked is None and self.mask is not None:
            masked = mask_bias(block(self.mask, hs, bs), self.dtype)
        terms = [t for t in (masked, block(self.bias, hs, bs)) if t is not None]
        kt = k.transpose(-1, -2)
        if self.rel_k is not None:
            key_buckets = times_table_t(qs, self.rel_k, hs)  # [h, b, Lq, 2c+1]
            place_offdiag(flat(out), *(flat(x) for x in place_parts(key_buckets, self.geo)), self.geo)
        elif terms:
            out.copy_(terms.pop().expand_as(out))
        else:
            return _softmax_(bmm_into(qs, kt, out))
        for term in terms:
            out.add_(term)
        flat(out).baddbmm_(flat(qs), flat(kt))
        return _softmax_(out)


class ChunkedRelativeAttention(torch.autograd.Function):
    """Chunked relation-aware attention with in-place intermediates (see module docstring). Inputs are validated,
    cast to one dtype and dead-row-revived by ``dispatch.relative_attention``."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        q: Tensor,  # [B, H, Lq, d], any strides
        k: Tensor,  # [B, H, Lk, d]
        v: Tensor,  # [B, H, Lk, d]
        rel_k: Tensor | None,  # [2c+1, d] or [H, 2c+1, d]
        rel_v: Tensor | None,
        bias: Tensor | None,  # float, 4-d, broadcastable to [B, H, Lq, Lk]: added to the logits
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
        geo = Geometry.build(q_len, k_len, clip, offset, dtype, device)
        bias_h = None if bias is None else bias.transpose(0, 1)
        scores = _Scores(rel_k, geo, None if mask is None else mask.transpose(0, 1), bias_h, dtype)
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
                fold_into(flat(f_c), flat(p), geo, flat(scratch), None if keep_h is not None else 1.0)
                add_times_table_(out_c, f_c, rel_v, hs)
        if dead is not None:
            out.masked_fill_(dead.transpose(0, 1), 0)

        ctx.save_for_backward(q, k, v, rel_k, rel_v, bias, out, folded, probs, mask, dead, keep)
        ctx.config = (clip, offset, dropout_p, chunk_bytes)
        ctx.bufs = bufs  # reused by the backward pass: on CPU their pages are then already mapped
        return out.transpose(0, 1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        q, k, v, rel_k, rel_v, bias, out, folded, probs, mask, dead, keep = ctx.saved_tensors
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
        geo = Geometry.build(q_len, k_len, clip, offset, dtype, device)
        mask_h = None if mask is None else mask.transpose(0, 1)
        bias_h = None if bias is None else bias.transpose(0, 1)
        scores = None if probs is not None else _Scores(rel_k, geo, mask_h, bias_h, dtype)
        # head-major like the chunks, so that each chunk adds to a block
        grad_bias_h = None if bias is None or not ctx.needs_input_grad[5] else torch.zeros_like(bias_h)
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
                    place_offdiag(flat(g), *(flat(x) for x in place_parts(grad_buckets, geo)), geo)
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
            add_broadcast_grad_(grad_bias_h, ds, hs, bs)
            gq_c = bmm_into(ds, k_c, grad_q[hs, bs])
            bmm_into(ds.transpose(-1, -2), q_c, grad_k[hs, bs])
            if rel_k is not None:  # rows of dS sum to 0 (softmax is shift invariant)
                fold_ds = bufs("fold", (*shape[:3], 2 * clip + 1))
                fold_into(flat(fold_ds), flat(ds), geo, flat(bufs("p" if probs is None else "scratch", shape)), 0.0)
                add_times_table_(gq_c, fold_ds, rel_k, hs)
                add_table_grad_(grad_rel_k, fold_ds, q_c, hs)
        grad_q.mul_(scale)  # the chunk q copies were already scaled, so grad_k and the table grads are final
        grad_bias = None if grad_bias_h is None else grad_bias_h.transpose(0, 1)
        grads = (grad_q.transpose(0, 1), grad_k.transpose(0, 1), grad_v.transpose(0, 1), grad_rel_k, grad_rel_v)
        return grads + (grad_bias,) + (None,) * 8

