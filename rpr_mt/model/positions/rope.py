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
from rpr_mt.model.kernels.rotary import rotate_half_split
from rpr_mt.model.positions.base import AttentionPositions, PositionScheme, Stack

__all__ = ["Rotary", "RotaryPositions", "rotate"]


def rotate(x: Tensor, positions: Tensor, base: float = 10000.0) -> Tensor:
    """x [..., L, d] (d even) rotated by ``positions`` [L]: (x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos) with x1,
    x2 the two halves of the last dim and angles computed in float64."""
    dim = x.size(-1)
    if dim % 2:
        raise ValueError(f"rotary embeddings need an even head dimension, got {dim}")
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=x.device) / dim)  # [d/2]
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # [L, d/2]
    return _Rotate.apply(x, angles.cos().to(x.dtype), angles.sin().to(x.dtype))


class _Rotate(torch.autograd.Function):
    """The rotation in one pass over x (``rotate_half_split``: a C kernel on float32 CPU tensors) instead of the
    five of the plain expression and its autograd backward; the backward pass is the inverse rotation."""

    @staticmethod
    def forward(ctx, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(cos, sin)
        return rotate_half_split(x, cos, sin)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        cos, sin = ctx.saved_tensors
        return rotate_half_split(grad, cos, sin, inverse=True), None, None


class Rotary(AttentionPositions):
    def __init__(self, base: float) -> None:
        super().__init__()
        self.base = base

    def extra_repr(self) -> str:
        return f"base={self.base}"

    def rotate(self, x: Tensor, offset: int) -> Tensor:
        return rotate(x, torch.arange(offset, offset + x.size(-2), device=x.device), self.base)


class RotaryPositions(PositionScheme):
    """``rope``: rotary queries and keys in every self-attention layer."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.base = cfg.rope.base

    def self_attention(self, stack: Stack, index: int) -> Rotary:
        return Rotary(self.base)
