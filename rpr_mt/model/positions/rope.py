"""Rotary position embeddings: Su et al. (2021/2024), "RoFormer: Enhanced Transformer with Rotary Position
Embedding".

Queries and keys of self-attention are rotated by their positions before the product: the pair of dimensions
(m, m + d/2) of a vector at position p turns by the angle p * base^(-2m/d) (the half-split layout of GPT-NeoX and
Llama), so that q_i . k_j depends on the positions only through i - j. Keys are cached rotated; nothing is learned.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rpr_mt.config import ModelConfig
from rpr_mt.model.kernels import content_attention
from rpr_mt.model.kernels import rotary as kernels_rotary
from rpr_mt.model.masks import PreparedMask
from rpr_mt.model.positions.base import AttentionPositions, PositionScheme, Stack

__all__ = ["Rotary", "RotaryPositions", "rotate"]


def rotate(x: Tensor, positions: Tensor, base: float = 10000.0) -> Tensor:
    """x [..., L, d] (d even) rotated by ``positions`` [L]: (x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos) with x1,
    x2 the two halves of the last dim and angles computed in float64."""
    return kernels_rotary.rotate(x, *kernels_rotary.angles(positions, x.size(-1), base, x.dtype))


class Rotary(AttentionPositions):
    def __init__(self, base: float) -> None:
        super().__init__()
        self.base = base

    def extra_repr(self) -> str:
        return f"base={self.base}"

    def rotate(self, x: Tensor, offset: int) -> Tensor:
        return rotate(x, torch.arange(offset, offset + x.size(-2), device=x.device), self.base)

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | PreparedMask | None, offset: int,
        dropout_p: float, rotated: bool = True,
    ) -> Tensor:
        if rotated:
            return super().attend(q, k, v, attn_mask=attn_mask, offset=offset, dropout_p=dropout_p)
        # unrotated q and k: the attention kernel turns them (the native one on the copies it makes anyway)
        positions = torch.arange(max(offset + q.size(2), k.size(2)), device=q.device)
        angles = kernels_rotary.angles(positions, q.size(-1), self.base, q.dtype)
        return content_attention(q, k, v, attn_mask=attn_mask, rotary=angles, offset=offset, dropout_p=dropout_p)


class RotaryPositions(PositionScheme):
    """``rope``: rotary queries and keys in every self-attention layer."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.base = cfg.rope.base

    def self_attention(self, stack: Stack, index: int) -> Rotary:
        return Rotary(self.base)
