"""ALiBi: Press, Smith & Lewis (2022), "Train Short, Test Long: Attention with Linear Biases Enables Input Length
Extrapolation".

Each head h subtracts m_h |i - j| from its logits, with fixed slopes m_h forming a geometric sequence (no learned
parameters, no position vectors). The encoder's bias is symmetric in |i - j|; in the decoder the causal mask hides
keys to the right, so the same bias is the paper's causal -m_h (i - j).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rpr_mt.config import ModelConfig
from rpr_mt.model.kernels.geometry import distance_range, toeplitz
from rpr_mt.model.positions.base import AttentionPositions, PositionScheme, Stack

__all__ = ["ALiBiBias", "ALiBiPositions", "alibi_slopes"]


def alibi_slopes(n_heads: int) -> Tensor:
    """The paper's head slopes (float64 [n_heads]): for n a power of two, 2^(-8/n), 2^(-16/n), ..., 2^(-8); for
    other n, the slopes of the largest power of two p < n followed by every other slope of 2p (Press et al.'s
    reference code)."""
    if n_heads < 1:
        raise ValueError(f"n_heads must be >= 1, got {n_heads}")

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    p = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = geometric(p) if p == n_heads else geometric(p) + geometric(2 * p)[0::2][: n_heads - p]
    return torch.tensor(slopes, dtype=torch.float64)


class ALiBiBias(AttentionPositions):
    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads).float(), persistent=False)

    def logit_bias(self, q_len: int, k_len: int, offset: int, device: torch.device) -> Tensor:
        distance = distance_range(q_len, k_len, offset, device).abs()  # [Lq + Lk - 1]
        return toeplitz(-self.slopes[:, None] * distance, q_len, k_len)  # [H, Lq, Lk]


class ALiBiPositions(PositionScheme):
    """``alibi``: linear biases in every self-attention layer; nothing learned."""

    def self_attention(self, stack: Stack, index: int) -> ALiBiBias:
        return ALiBiBias(self.n_heads)
