"""The T5 relative attention bias: Raffel et al. (2020), "Exploring the Limits of Transfer Learning with a Unified
Text-to-Text Transformer", Section 2.1.

Each head adds a learned scalar to its logits, chosen by a bucket of the relative position: exact for small
distances, logarithmic up to ``max_distance``, one bucket beyond. The encoder's buckets tell left from right
(bidirectional), the decoder's only look back. One table [num_buckets, H] serves every layer of a stack, as in T5,
or each layer has its own (``model.t5.per_layer``). Unlike T5 we keep the 1/sqrt(d) scaling of q . k; the bias is
added to the scaled logits. The table starts at zero (content-only attention) and is learned.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from rpr_mt.config import ModelConfig
from rpr_mt.model.kernels.geometry import distance_range, toeplitz
from rpr_mt.model.positions.base import AttentionPositions, PositionScheme, Stack

__all__ = ["T5Bias", "T5Positions", "t5_relative_bucket"]


def t5_relative_bucket(
    relative_position: Tensor, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> Tensor:
    """The bucket of each relative position, numbered as in the T5 reference implementation.

    ``relative_position`` = key position - query position (negative: the key is to the left). Bidirectional: the
    first half of the buckets is for keys at or left of the query, the second half (offset by num_buckets / 2) for
    keys to its right. Unidirectional (a decoder): keys to the right all fall into bucket 0, which the causal mask
    hides anyway. Within a half of n buckets, distances 0 .. n/2 - 1 each have their own bucket; larger distances
    share n/2 buckets spaced logarithmically up to ``max_distance``; anything farther is in the last bucket.

    Example (bidirectional, 32 buckets, max distance 128): positions -1, -7, -8, -9, -20, -128, -500 map to
    1, 7, 8, 8, 10, 15, 15, and +1, +8 to 17, 24.

    Args:
        relative_position: LongTensor of any shape.
        bidirectional: encoder (True) or decoder (False) buckets.
        num_buckets: number of buckets (even when bidirectional).
        max_distance: distances from here on share the last bucket of their direction.

    Returns:
        LongTensor of the same shape, values in [0, num_buckets).
    """
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)  # only keys to the left count
    exact = num_buckets // 2
    # log-spaced buckets exact .. num_buckets - 1 for distances exact .. max_distance, in float32 like the reference
    # (so that distances on a bucket boundary round the same way); clamped below at exact so that the log stays
    # finite where torch.where discards the value anyway
    log_ratio = torch.log(distance.clamp(min=exact).float() / exact) / math.log(max_distance / exact)
    large = (exact + (log_ratio * (num_buckets - exact)).long()).clamp(max=num_buckets - 1)
    return buckets + torch.where(distance < exact, distance, large)


class T5Bias(AttentionPositions):
    """The T5 bias of one layer: its own table, or the stack's table held by the scheme (not registered here, so
    that it is saved once)."""

    def __init__(
        self, n_heads: int, bidirectional: bool, num_buckets: int, max_distance: int, shared: nn.Embedding | None
    ) -> None:
        super().__init__()
        self.bidirectional, self.num_buckets, self.max_distance = bidirectional, num_buckets, max_distance
        self.table = nn.Embedding(num_buckets, n_heads) if shared is None else None
        if self.table is not None:
            nn.init.zeros_(self.table.weight)
        self._shared = [shared] if shared is not None else []  # a list: nn.Module does not register it

    def extra_repr(self) -> str:
        return (f"bidirectional={self.bidirectional}, num_buckets={self.num_buckets}, "
                f"max_distance={self.max_distance}, shared={self.table is None}")

    def logit_bias(self, q_len: int, k_len: int, offset: int, device: torch.device) -> Tensor:
        table = self.table if self.table is not None else self._shared[0]
        buckets = t5_relative_bucket(
            distance_range(q_len, k_len, offset, device), self.bidirectional, self.num_buckets, self.max_distance
        )  # [Lq + Lk - 1]
        return toeplitz(table(buckets).t(), q_len, k_len)  # [H, Lq, Lk]


class T5Positions(PositionScheme):
    """``t5``: a bucketed bias in every self-attention layer, one table per stack (or per layer)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.settings = cfg.t5
        self.encoder_table: nn.Embedding | None = None
        self.decoder_table: nn.Embedding | None = None
        if not cfg.t5.per_layer:
            self.encoder_table = nn.Embedding(cfg.t5.num_buckets, cfg.n_heads)
            self.decoder_table = nn.Embedding(cfg.t5.num_buckets, cfg.n_heads)
            nn.init.zeros_(self.encoder_table.weight)
            nn.init.zeros_(self.decoder_table.weight)

    def self_attention(self, stack: Stack, index: int) -> T5Bias:
        s = self.settings
        shared = self.encoder_table if stack == "encoder" else self.decoder_table
        return T5Bias(self.n_heads, stack == "encoder", s.num_buckets, s.max_distance, shared)
