"""Chunked iteration over the [Lq, Lk] matrices of multi-head attention, shared by the pure-torch
(``torch_chunked``) and native (C kernel) implementations of relation-aware attention.

Both walk over chunks of whole [Lq, Lk] matrices: blocks of heads x batch rows, in head-major order, a few MiB each
on CPU so that a chunk's buffers stay in the last-level cache. Each chunk's q, k, v are copied into small contiguous
head-major buffers, so that every batched matmul reads and writes plain contiguous blocks (on CPU, matmuls on strided
operands or into strided outputs fall back to much slower paths). All per-chunk intermediates live in buffers reused
by every chunk and by the backward pass: on CPU every fresh multi-megabyte tensor costs page faults.
"""

from __future__ import annotations

import math
from typing import Iterator

import torch
from torch import Tensor

__all__ = [
    "ChunkBuffers",
    "add_table_grad_",
    "add_broadcast_grad_",
    "add_times_table_",
    "block",
    "bmm_into",
    "by_head",
    "chunks",
    "flat",
    "matrix_bytes",
    "times_table_t",
]


def chunks(heads: int, batch: int, matrix_size: int, budget: int) -> Iterator[tuple[slice, slice]]:
    """(head slice, batch slice) blocks of whole [Lq, Lk] matrices, each at most ``budget`` bytes (at least one
    matrix). Blocks span all batch rows of several heads, or part of the batch of one head, so that every block of
    a contiguous [H, B, ..] tensor is itself contiguous."""
    per_head = batch * matrix_size
    if per_head <= budget:
        step = max(1, budget // per_head)
        for h in range(0, heads, step):
            yield slice(h, min(h + step, heads)), slice(0, batch)
    else:
        step = max(1, budget // max(matrix_size, 1))
        for h in range(heads):
            for b in range(0, batch, step):
                yield slice(h, h + 1), slice(b, min(b + step, batch))


def block(t: Tensor | None, hs: slice, bs: slice) -> Tensor | None:
    """Slice an [H?, B?, ..] tensor whose head/batch dims may be broadcast (size 1)."""
    if t is None:
        return None
    return t[hs if t.size(0) > 1 else slice(None), bs if t.size(1) > 1 else slice(None)]


def flat(x: Tensor) -> Tensor:
    """[h, b, m, n] -> [h * b, m, n] (a view for the contiguous blocks used here)."""
    return x.reshape(-1, *x.shape[-2:])


def bmm_into(a: Tensor, b: Tensor, out: Tensor, alpha: float = 1.0) -> Tensor:
    """Batched matmul alpha [.., m, n] @ [.., n, p] into a contiguous ``out`` [.., m, p] (same leading dims). The
    GEMM applies alpha as it writes: a scale costs no pass of its own."""
    if alpha == 1.0:
        torch.bmm(flat(a), flat(b), out=flat(out))
    else:  # beta = 0: out's old contents (even NaN) are ignored
        torch.baddbmm(flat(out), flat(a), flat(b), beta=0.0, alpha=alpha, out=flat(out))
    return out


class ChunkBuffers:
    """Chunk buffers, allocated on first use and reused by every chunk (and by the backward pass of the same
    call: on CPU their pages are then already mapped)."""

    def __init__(self, dtype: torch.dtype, device: torch.device) -> None:
        self.dtype, self.device = dtype, device
        self.bufs: dict[str, Tensor] = {}

    def __call__(self, name: str, shape: tuple[int, ...]) -> Tensor:
        numel = math.prod(shape)
        if name not in self.bufs or self.bufs[name].numel() < numel:  # the first chunk is the largest
            self.bufs[name] = torch.empty(numel, dtype=self.dtype, device=self.device)
        return self.bufs[name][:numel].view(shape)

    def copy(self, name: str, x: Tensor, scale: float | None = None) -> Tensor:
        """Contiguous copy of a chunk block (optionally scaled) in buffer ``name``."""
        buf = self(name, tuple(x.shape))
        return buf.copy_(x) if scale is None else torch.mul(x, scale, out=buf)

    def contiguous(self, name: str, x: Tensor) -> Tensor:
        """A chunk block as it is when contiguous (read only), else its copy in buffer ``name``."""
        return x if x.is_contiguous() else self.copy(name, x)


def matrix_bytes(q_len: int, k_len: int, dim: int, element_size: int) -> int:
    """Bytes per [Lq, Lk] matrix of the largest per-chunk buffer (scores, or the k/v copies when Lq is small)."""
    return max(q_len * k_len, k_len * dim, q_len * dim) * element_size


# Products with the relative tables (shared [R, d] or per head [H, R, d]), one matmul over all of a chunk's rows.


def by_head(x: Tensor) -> Tensor:
    """Contiguous [h, b, L, n] -> [h, b * L, n]."""
    return x.view(x.shape[0], -1, x.shape[-1])


def times_table_t(x: Tensor, table: Tensor, hs: slice, alpha: float = 1.0) -> Tensor:
    """alpha x @ w^T for a chunk x [h, b, L, d] and the table of its heads (shared [R, d] or per head [H, R, d])."""
    if table.dim() == 2:
        out = x.new_empty(x.numel() // x.shape[-1], table.shape[0])
        torch.addmm(out, x.view(-1, x.shape[-1]), table.t(), beta=0.0, alpha=alpha, out=out)
    else:
        out = x.new_empty(x.shape[0], x.numel() // (x.shape[0] * x.shape[-1]), table.shape[-2])
        torch.baddbmm(out, by_head(x), table[hs].transpose(1, 2), beta=0.0, alpha=alpha, out=out)
    return out.view(*x.shape[:-1], -1)


def add_times_table_(out: Tensor, f: Tensor, table: Tensor, hs: slice, alpha: float = 1.0) -> None:
    """out += alpha f @ w for a chunk f [h, b, L, R], out [h, b, L, d] (both contiguous)."""
    if table.dim() == 2:
        out.view(-1, out.shape[-1]).addmm_(f.view(-1, f.shape[-1]), table, alpha=alpha)
    else:
        by_head(out).baddbmm_(by_head(f), table[hs], alpha=alpha)


def add_table_grad_(grad: Tensor, f: Tensor, x: Tensor, hs: slice, alpha: float = 1.0) -> None:
    """grad += alpha sum over the chunk's batch (and heads, for a shared table) of f^T @ x."""
    if grad.dim() == 2:
        grad.addmm_(f.view(-1, f.shape[-1]).t(), x.view(-1, x.shape[-1]), alpha=alpha)
    else:
        grad[hs].baddbmm_(by_head(f).transpose(1, 2), by_head(x), alpha=alpha)


def add_broadcast_grad_(grad: Tensor | None, x: Tensor, hs: slice, bs: slice) -> None:
    """grad [H?, B?, Lq?, Lk] (head-major, size-1 dims broadcast) += a chunk x [h, b, Lq, Lk] summed over the dims
    that grad broadcasts: the gradient of an additive logit bias is the logits' gradient, reduced to its shape."""
    if grad is None:
        return
    dims = [i for i in range(3) if grad.size(i) == 1 and x.size(i) > 1]
    block(grad, hs, bs).add_(x.sum(dims, keepdim=True) if dims else x)
