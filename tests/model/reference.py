"""Slow reference for relation-aware attention, written straight from Shaw, Uszkoreit & Vaswani (2018), eqs. (3)-(4).

Python loops over batch, head, query i and key j; float64 in tests. Differentiable through autograd, so gradients
of the fast implementations can be compared against it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def reference_attention(
    q: Tensor,  # [B, H, Lq, d]
    k: Tensor,  # [B, H, Lk, d]
    v: Tensor,  # [B, H, Lk, d]
    rel_k: Tensor | None,  # None, [2c+1, d] or [H, 2c+1, d]
    rel_v: Tensor | None,
    clip: int,
    mask: Tensor | None = None,  # bool, broadcastable to [B, H, Lq, Lk], True = may attend
    offset: int = 0,
    keep: Tensor | None = None,  # bool [B, H, Lq, Lk] dropout keep mask
    dropout_p: float = 0.0,
    bias: Tensor | None = None,  # float, broadcastable to [B, H, Lq, Lk]: added to e_ij
) -> Tensor:
    batch, heads, q_len, dim = q.shape
    k_len = k.shape[2]
    if mask is not None:
        mask = mask.expand(batch, heads, q_len, k_len)
    if bias is not None:
        bias = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape)).expand(batch, heads, q_len, k_len)

    def table(t: Tensor | None, h: int, r: int) -> Tensor | float:
        if t is None:
            return 0.0
        return t[r] if t.dim() == 2 else t[h, r]

    rows_b = []
    for b in range(batch):
        rows_h = []
        for h in range(heads):
            rows_i = []
            for i in range(q_len):
                allowed = [j for j in range(k_len) if mask is None or bool(mask[b, h, i, j])]
                if not allowed:  # a query with nothing to attend to outputs zeros
                    rows_i.append(torch.zeros(dim, dtype=q.dtype))
                    continue
                r = {j: min(max(j - (i + offset), -clip), clip) + clip for j in allowed}  # r_ij
                e = torch.stack(
                    [(q[b, h, i] * (k[b, h, j] + table(rel_k, h, r[j]))).sum() / math.sqrt(dim)
                     + (0.0 if bias is None else bias[b, h, i, j]) for j in allowed]
                )  # e_ij, eq. (4)
                alpha = torch.softmax(e, dim=0)
                z = torch.zeros(dim, dtype=q.dtype)
                for n, j in enumerate(allowed):
                    weight = alpha[n]
                    if keep is not None:
                        weight = weight * keep[b, h, i, j] / (1.0 - dropout_p)
                    z = z + weight * (v[b, h, j] + table(rel_v, h, r[j]))  # eq. (3)
                rows_i.append(z)
            rows_h.append(torch.stack(rows_i))
        rows_b.append(torch.stack(rows_h))
    return torch.stack(rows_b)
