"""Attention as plain autograd compositions: the readable reference of every kernel, and the fast path where the
problem is small (incremental decoding: a few queries; content attention on short training sentences).

``relative_attention_gather`` places the key term with ``torch.gather`` and folds the value term with
``scatter_add`` (Shaw et al. 2018, eqs. (3)-(4)); without tables it is matmul-softmax-matmul. It takes an optional
float logit bias. Inputs are validated, cast and dead-row-revived by ``dispatch``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rpr_mt.model.kernels.geometry import relative_position_index

__all__ = ["relative_attention_gather"]


def relative_attention_gather(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rel_k: Tensor | None,
    rel_v: Tensor | None,
    bias: Tensor | None,
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
    if rel_k is not None or rel_v is not None:
        index = relative_position_index(q_len, k_len, clip, offset, device=q.device).expand(batch, heads, q_len, k_len)
    scores = q @ k.transpose(-1, -2)  # [B, H, Lq, Lk]
    if rel_k is not None:
        scores = scores + torch.gather(q @ rel_k.transpose(-1, -2), -1, index)  # [B, H, Lq, 2c+1] -> [.., Lk]
    scores = scores * dim**-0.5
    if bias is not None:
        scores = scores + bias
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

