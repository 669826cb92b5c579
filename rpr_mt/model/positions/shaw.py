"""Relative position representations: Shaw, Uszkoreit & Vaswani (2018), Section 3.

    e_ij = q_i . (k_j + w^K[r_ij]) / sqrt(d)      z_i = sum_j softmax_j(e_ij) (v_j + w^V[r_ij])
    r_ij = clip(j - i, -k, k) + k                 (``relative_position_index``)

Two *separate* learned tables w^K and w^V of 2k + 1 vectors each (never tied, unlike OpenNMT-py), per layer, per
head ([H, 2k+1, d_head], the paper's base model) or shared across heads ([2k+1, d_head], its big model). Either term
can be switched off (the paper's Table 3). The scheme owns the attention product: the kernels in
``rpr_mt.model.kernels`` place the key term and fold the value term without a per-pair [Lq, Lk, d] tensor.
"""

from __future__ import annotations

from torch import Tensor, nn

from rpr_mt.config import ModelConfig
from rpr_mt.model.kernels import relative_attention
from rpr_mt.model.kernels.geometry import relative_position_index
from rpr_mt.model.masks import PreparedMask
from rpr_mt.model.positions.base import AttentionPositions, PositionScheme, Stack

__all__ = ["ShawPositions", "ShawTables", "relative_position_index"]


class ShawTables(AttentionPositions):
    """The w^K / w^V tables of one self-attention layer, initialised N(0, d_head^-1/2) so that q . w^K starts at the
    scale of q . k for unit-variance keys."""

    def __init__(
        self, n_heads: int, d_head: int, clip: int, *, use_key: bool = True, use_value: bool = True,
        share_across_heads: bool = False,
    ) -> None:
        super().__init__()
        if clip < 0:
            raise ValueError(f"clip must be >= 0, got {clip}")
        self.clip = clip
        shape = (2 * clip + 1, d_head) if share_across_heads else (n_heads, 2 * clip + 1, d_head)
        self.rel_k = nn.Parameter(nn.init.normal_(Tensor(*shape), std=d_head**-0.5)) if use_key else None
        self.rel_v = nn.Parameter(nn.init.normal_(Tensor(*shape), std=d_head**-0.5)) if use_value else None

    def extra_repr(self) -> str:
        table = self.rel_k if self.rel_k is not None else self.rel_v
        return (f"clip={self.clip}, key={self.rel_k is not None}, value={self.rel_v is not None}, "
                f"shared={table is not None and table.dim() == 2}")

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | PreparedMask | None, offset: int,
        dropout_p: float, rotated: bool = True,
    ) -> Tensor:  # no rotation: ``rotated`` does not matter
        return relative_attention(
            q, k, v, self.rel_k, self.rel_v, clip=self.clip, attn_mask=attn_mask, offset=offset, dropout_p=dropout_p
        )


class ShawPositions(PositionScheme):
    """``relative`` (and, with absolute vectors too, ``absolute+relative``): Shaw tables in every self-attention
    layer of encoder and decoder, set by model.clip, use_key, use_value and share_across_heads."""

    def __init__(self, cfg: ModelConfig, absolute: bool = False) -> None:
        super().__init__(cfg, absolute=absolute)
        self.cfg = cfg

    def self_attention(self, stack: Stack, index: int) -> ShawTables:
        c = self.cfg
        return ShawTables(self.n_heads, self.d_head, c.clip, use_key=c.use_key, use_value=c.use_value,
                          share_across_heads=c.share_across_heads)
