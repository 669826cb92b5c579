"""The contract between the Transformer and a position scheme, in two small halves.

``PositionScheme`` (one per model, built from ``ModelConfig`` by ``rpr_mt.model.positions.build_position_scheme``):

    embed(x, offset)            what the scheme adds to the scaled token embeddings (absolute vectors, or nothing)
    self_attention(stack, i)    the ``AttentionPositions`` of self-attention layer i of the encoder or decoder

``AttentionPositions`` (one per self-attention layer, owned by that layer, asked by ``MultiHeadAttention``):

    rotate(x, offset)                        rotate queries or keys by their positions before the product (RoPE);
                                             keys are cached rotated
    logit_bias(q_len, k_len, offset, dev)    an additive logit bias broadcastable to [B, H, Lq, Lk] (T5, ALiBi)
    attend(q, k, v, ..., rotated)            the whole product, when the scheme owns it (Shaw's tables,
                                             Transformer-XL); by default content attention plus ``logit_bias``

With a cache (decoding) the layer rotates q and the new keys itself, so that the cache holds rotated keys, and calls
``attend(..., rotated=True)``. Without one (a whole sequence: training, the encoder) it hands q and k over unrotated
(``rotated=False``), so that a rotating scheme can turn them inside the attention kernel (``Rotary``); the default
``attend`` calls ``rotate`` first.

Every hook has a no-op default, so a scheme overrides only what it computes. Queries sit at positions
offset .. offset + Lq - 1 and keys at 0 .. Lk - 1 (cached decoding passes the cache length as the offset).
Encoder-decoder attention is content-only for every scheme, as in Shaw et al. (2018), and never asks a scheme.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from rpr_mt.config import ModelConfig
from rpr_mt.model.kernels import content_attention
from rpr_mt.model.masks import PreparedMask
from rpr_mt.model.positions.absolute import AbsoluteEncoding

Stack = Literal["encoder", "decoder"]

__all__ = ["AttentionPositions", "PositionScheme", "Stack"]


class AttentionPositions(nn.Module):
    """The position terms of one self-attention layer; the defaults give content-only attention."""

    def rotate(self, x: Tensor, offset: int) -> Tensor:
        """Queries or keys [B, H, L, d_head] at positions offset .. offset + L - 1, rotated (default: unchanged)."""
        return x

    def logit_bias(self, q_len: int, k_len: int, offset: int, device: torch.device) -> Tensor | None:
        """Additive bias on the scaled logits, broadcastable to [B, H, Lq, Lk] (default: none)."""
        return None

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | PreparedMask | None, offset: int,
        dropout_p: float, rotated: bool = True,
    ) -> Tensor:
        """Attention output [B, H, Lq, d_head] for q [B, H, Lq, d_head], k and v [B, H, Lk, d_head] and a boolean
        mask (True = may attend); ``rotated``: whether ``rotate`` was applied to q and k already."""
        if not rotated:
            q, k = self.rotate(q, offset), self.rotate(k, 0)
        bias = self.logit_bias(q.size(2), k.size(2), offset, q.device)
        return content_attention(q, k, v, attn_mask=attn_mask, bias=bias, dropout_p=dropout_p)


class PositionScheme(nn.Module):
    """Order information for the whole model. This base class is the ``none`` scheme when ``absolute`` is False
    and the ``absolute`` scheme (Vaswani et al. 2017) when it is True; subclasses add attention terms and may keep
    absolute vectors too (``absolute+relative``)."""

    def __init__(self, cfg: ModelConfig, absolute: bool = False) -> None:
        super().__init__()
        self.n_heads, self.d_head = cfg.n_heads, cfg.d_model // cfg.n_heads
        self.absolute = AbsoluteEncoding(cfg.max_positions, cfg.d_model, cfg.absolute_kind) if absolute else None

    def embed(self, x: Tensor, offset: int) -> Tensor:
        """Scaled token embeddings [B, L, d_model] at positions offset .. offset + L - 1, plus absolute vectors."""
        return x if self.absolute is None else self.absolute(x, offset)

    def self_attention(self, stack: Stack, index: int) -> AttentionPositions:
        """A new ``AttentionPositions`` for self-attention layer ``index`` of ``stack`` (default: content-only)."""
        return AttentionPositions()
