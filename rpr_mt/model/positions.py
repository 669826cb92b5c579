"""Position tables: relative-position bucket indices (Shaw et al., 2018) and absolute sinusoids (Vaswani et al., 2017).

Pure functions with no state; callers cache results if they need to.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


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

    Args:
        q_len: number of queries (rows).
        k_len: number of keys (columns).
        clip: maximum relative distance k >= 0 (the paper's k).
        offset: absolute position of the first query.
        device: device of the returned tensor.

    Returns:
        LongTensor [q_len, k_len] with values in [0, 2k].
    """
    if clip < 0:
        raise ValueError(f"clip must be >= 0, got {clip}")
    if q_len < 0 or k_len < 0:
        raise ValueError(f"lengths must be >= 0, got q_len={q_len}, k_len={k_len}")
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    query_pos = torch.arange(offset, offset + q_len, device=device)  # [Lq]
    key_pos = torch.arange(k_len, device=device)  # [Lk]
    distance = key_pos[None, :] - query_pos[:, None]  # [Lq, Lk], j - i
    return distance.clamp(-clip, clip) + clip


def sinusoidal_positions(
    length: int,
    dim: int,
    offset: int = 0,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Sinusoidal absolute position encodings of Vaswani et al. (2017), Section 3.5.

        PE[pos, 2m]     = sin(pos / 10000^(2m / dim))
        PE[pos, 2m + 1] = cos(pos / 10000^(2m / dim))

    i.e. sines on the even dimensions and cosines on the odd dimensions, interleaved exactly as in the paper's
    formula (tensor2tensor and fairseq concatenate the two halves instead; the information is the same up to a
    fixed permutation of dimensions). For odd ``dim`` the last dimension is a sine. Computed in float64, then cast,
    so that large positions keep full precision. Used by the absolute-position mode of the model (Shaw et al. 2018
    compare against, and combine with, these).

    Args:
        length: number of positions (rows).
        dim: model dimension (columns).
        offset: position of the first row (for incremental decoding).

    Returns:
        Tensor [length, dim] of ``dtype``.
    """
    if length < 0 or dim < 0 or offset < 0:
        raise ValueError(f"length, dim and offset must be >= 0, got {length}, {dim}, {offset}")
    pos = torch.arange(offset, offset + length, dtype=torch.float64, device=device)[:, None]  # [L, 1]
    two_m = torch.arange(0, dim, 2, dtype=torch.float64, device=device)  # [ceil(dim/2)]
    inv_freq = torch.exp(two_m * (-math.log(10000.0) / max(dim, 1)))  # 1 / 10000^(2m/dim)
    angles = pos * inv_freq[None, :]  # [L, ceil(dim/2)]
    table = torch.empty(length, dim, dtype=torch.float64, device=device)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : dim // 2])
    return table.to(dtype)
