"""The place / fold pair that carries every relative-position term of Shaw et al. (2018) between a bucket tensor
A [.., Lq, 2k+1] and a pair tensor X [.., Lq, Lk], without a per-pair [Lq, Lk, d] tensor:

    place(A)[i, j] = A[i, r_ij]                       (gather by bucket)
    fold(X)[i, r]  = sum_{j : r_ij = r} X[i, j]       (sum into buckets)
    r_ij = clip(j - (i + offset), -k, k) + k

They are adjoints of each other (<place(A), X> = <A, fold(X)>), so each is the other's backward. ``place`` is done
without a full-size gather: softmax ignores per-row constants, so the low clipped region (bucket 0) costs nothing,
the high region (bucket 2k) is one broadcast multiply, and the 2k - 1 interior diagonals are written through a
strided "band" view (row stride Lk + 1). ``fold`` is a masked row sum for the low region, the band view for the
interior and "row total minus the rest" for the high region.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "Geometry",
    "fold",
    "fold_into",
    "place",
    "place_offdiag",
    "place_parts",
    "distance_range",
    "relative_distance",
    "toeplitz",
    "relative_position_index",
]


@dataclass
class Geometry:
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
    def build(q_len: int, k_len: int, clip: int, offset: int, dtype: torch.dtype, device: torch.device) -> "Geometry":
        if clip == 0:
            return Geometry(0, offset, k_len)
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
        return Geometry(
            clip, offset, k_len, (distance <= -clip).to(dtype), (distance >= clip).to(dtype), (i0, i1), tuple(edges)
        )

    def band(self, x: Tensor) -> Tensor:
        """[n, i1 - i0, 2k - 1] view of the interior diagonals of rows i0..i1 of a contiguous [n, Lq, Lk] x."""
        i0, i1 = self.band_rows
        start = x.storage_offset() + i0 * self.k_len + i0 + self.offset - self.clip + 1
        return x.as_strided((x.shape[0], i1 - i0, 2 * self.clip - 1), (x.stride(0), self.k_len + 1, 1), start)


def place_parts(buckets: Tensor, geo: Geometry) -> tuple[Tensor, Tensor]:
    """Split place(A) - A[.., 0] into per-row pieces: (A[2k] - A[0]) [.., Lq, 1] for the high region and
    (A[t] - A[0]) [.., Lq, 2k-1] for the interior diagonals."""
    first = buckets[..., :1]
    return buckets[..., -1:] - first, buckets[..., 1:-1] - first


def place_offdiag(out: Tensor, high_delta: Tensor, inner: Tensor, geo: Geometry) -> Tensor:
    """out [n, Lq, Lk] (contiguous) <- place(A) - A[.., 0] from the pieces of ``place_parts``: a broadcast
    multiply for the high region plus the 2k - 1 interior diagonals, several times faster than a full gather."""
    torch.mul(geo.high, high_delta, out=out)
    i0, i1 = geo.band_rows
    if i1 > i0:
        geo.band(out).add_(inner[:, i0:i1])
    for rows, column, valid in geo.edges:  # diagonals leaving the matrix add 0 to a clamped column
        edge = inner[:, rows] * valid
        out[:, rows].scatter_add_(-1, column.expand(edge.shape), edge)
    return out


def fold_into(out: Tensor, x: Tensor, geo: Geometry, scratch: Tensor, total: float | None) -> None:
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
        geo = Geometry.build(q_len, k_len, clip, offset, a.dtype, a.device)
        place_offdiag(out, *place_parts(a, geo), geo).add_(a[..., :1])
    return out.view(*lead, q_len, k_len)


def fold(x: Tensor, clip: int, offset: int = 0) -> Tensor:
    """fold(X)[.., i, r] = sum_{j: r_ij = r} X[.., i, j], the adjoint of ``place``.

    x: [.., Lq, Lk] -> [.., Lq, 2k+1]. A plain function (no autograd)."""
    *lead, q_len, k_len = x.shape
    x3 = x.reshape(-1, q_len, k_len).contiguous()
    geo = Geometry.build(q_len, k_len, clip, offset, x.dtype, x.device)
    out = x.new_empty(x3.shape[0], q_len, 2 * clip + 1)
    fold_into(out, x3, geo, torch.empty_like(x3), None)
    return out.view(*lead, q_len, 2 * clip + 1)


def relative_position_index(
    q_len: int, k_len: int, clip: int, offset: int = 0, device: torch.device | str | None = None
) -> Tensor:
    """Index of the relative-position vector used by each (query, key) pair.

    Shaw, Uszkoreit & Vaswani (2018), "Self-Attention with Relative Position Representations", Section 3.2:
    the edge between input elements x_i and x_j is represented by the learned vectors a^K_ij = w^K_{r_ij} and
    a^V_ij = w^V_{r_ij} with

        r_ij = clip(j - i, -k, k) + k,

    so there are 2k + 1 distinct vectors w_0 .. w_{2k}: w_k is "same position", w_{k+d} is "key d positions to the
    right of the query", and every distance beyond k in either direction shares the end vector (w_0 or w_{2k}).
    With k = 0 every pair maps to the single vector w_0, which carries no order information.

    For incremental decoding the queries are the positions ``offset .. offset + q_len - 1`` and the keys are
    ``0 .. k_len - 1``, so the returned value is ``clip(j - (i + offset), -k, k) + k``.

    Example (k = 3, 10 tokens)::

        row 0: [3, 4, 5, 6, 6, 6, 6, 6, 6, 6]
        row 9: [0, 0, 0, 0, 0, 0, 0, 1, 2, 3]

    Returns:
        LongTensor [q_len, k_len] with values in [0, 2k].
    """
    if clip < 0:
        raise ValueError(f"clip must be >= 0, got {clip}")
    if q_len < 0 or k_len < 0:
        raise ValueError(f"lengths must be >= 0, got q_len={q_len}, k_len={k_len}")
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    return relative_distance(q_len, k_len, offset, device).clamp(-clip, clip) + clip


def relative_distance(q_len: int, k_len: int, offset: int = 0, device: torch.device | str | None = None) -> Tensor:
    """LongTensor [q_len, k_len] of j - (i + offset): key position minus query position (queries at offset..)."""
    query_pos = torch.arange(offset, offset + q_len, device=device)  # [Lq]
    key_pos = torch.arange(k_len, device=device)  # [Lk]
    return key_pos[None, :] - query_pos[:, None]


def distance_range(q_len: int, k_len: int, offset: int = 0, device: torch.device | str | None = None) -> Tensor:
    """LongTensor [q_len + k_len - 1] of every distance j - (i + offset) in a call, ascending: the values of a
    per-distance term before ``toeplitz`` spreads them over the [Lq, Lk] pairs."""
    return torch.arange(-(offset + q_len - 1), k_len - offset, device=device)


def toeplitz(values: Tensor, q_len: int, k_len: int) -> Tensor:
    """values [..., q_len + k_len - 1], one per entry of ``distance_range``, spread to [..., q_len, k_len]:
    out[..., i, j] = values[..., j - i + q_len - 1].

    A bias that depends on j - i only (T5, ALiBi) is computed on the Lq + Lk - 1 distances and spread here, so the
    per-distance work (buckets, table lookups, their gradients) is O(L) instead of O(L^2): the windows of ``unfold``
    read the values with stride 1 in j, and a flip of the rows turns window Lq - 1 - i into row i. The backward pass
    sums the gradient along the diagonals (unfold's backward), again without an O(L^2) index."""
    if values.size(-1) != q_len + k_len - 1:
        raise ValueError(f"values must have q_len + k_len - 1 = {q_len + k_len - 1} entries, got {values.size(-1)}")
    return values.unfold(-1, k_len, 1).flip(-2)
