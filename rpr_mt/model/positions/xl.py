"""Transformer-XL relative attention: Dai et al. (2019), "Transformer-XL: Attentive Language Models Beyond a
Fixed-Length Context", Section 3.3.

    A_ij = q_i . k_j  +  q_i . W_R R_{i-j}  +  u . k_j  +  v . W_R R_{i-j}          (a) + (b) + (c) + (d)
         = (q_i + u) . k_j  +  (q_i + v) . W_R R_{i-j}

with R the sinusoids of the relative distance i - j (not learned), W_R a learned projection per layer, and u, v
learned per head (shared by the layers of a stack as in the paper, or per layer by ``model.xl.per_layer_biases``).
The position half has the shape of Shaw et al.'s key term with the table P_r = W_R R at distance r, so it runs on the
same kernels: Shaw K-only attention of the queries q + u with table P, plus the per-bucket term (v - u) . P_r, gives
(q + u) . (k_j + P_r) + (v - u) . P_r = (q + u) . k_j + (q + v) . P_r. Distances are clipped at
``model.xl.clip`` if set (else every distance in the call has its own R); logits are scaled by 1/sqrt(d_head).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rpr_mt.config import ModelConfig
from rpr_mt.model.kernels import relative_attention
from rpr_mt.model.masks import PreparedMask
from rpr_mt.model.positions.absolute import sinusoids
from rpr_mt.model.positions.base import AttentionPositions, PositionScheme, Stack

__all__ = ["XLAttention", "XLBiases", "XLPositions"]


class XLBiases(nn.Module):
    """The global content bias u and position bias v, [H, d_head] each, starting at zero."""

    def __init__(self, n_heads: int, d_head: int) -> None:
        super().__init__()
        self.u = nn.Parameter(torch.zeros(n_heads, d_head))
        self.v = nn.Parameter(torch.zeros(n_heads, d_head))


class XLAttention(AttentionPositions):
    """W_R of one layer, with its own u, v or the stack's (held by the scheme, not registered here)."""

    def __init__(self, d_model: int, n_heads: int, clip: int | None, shared: XLBiases | None) -> None:
        super().__init__()
        self.d_model, self.n_heads, self.clip = d_model, n_heads, clip
        self.proj = nn.Linear(d_model, d_model, bias=False)  # W_R
        nn.init.xavier_uniform_(self.proj.weight)
        self.biases = XLBiases(n_heads, d_model // n_heads) if shared is None else None
        self._shared = [shared] if shared is not None else []  # a list: nn.Module does not register it

    def extra_repr(self) -> str:
        return f"clip={self.clip}, shared_biases={self.biases is None}"

    def position_table(self, clip: int, device: torch.device) -> Tensor:
        """P = W_R R [H, 2c+1, d_head]: row r holds the relative distance j - i = r - c, i.e. R_{i-j} = R_{c-r}."""
        distances = torch.arange(clip, -clip - 1, -1, device=device)  # i - j for r = 0 .. 2c
        table = self.proj(sinusoids(distances, self.d_model).to(self.proj.weight.dtype))  # [2c+1, D]
        return table.view(2 * clip + 1, self.n_heads, -1).transpose(0, 1)

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | PreparedMask | None, offset: int,
        dropout_p: float, rotated: bool = True,
    ) -> Tensor:  # no rotation: ``rotated`` does not matter
        q_len, k_len, d_head = q.size(2), k.size(2), q.size(3)
        reach = max(offset + q_len - 1, k_len - 1 - offset, 0)  # the longest distance in the call
        clip = reach if self.clip is None else min(self.clip, reach)
        biases = self.biases if self.biases is not None else self._shared[0]
        u, pos_bias = biases.u.to(q.dtype), biases.v.to(q.dtype)
        table = self.position_table(clip, q.device)  # [H, 2c+1, d_head]
        # (q + u) . (k_j + P_r) + (v - u) . P_r = (q + u) . k_j + (q + v) . P_r: the position bias v enters as a term
        # per bucket, [H, 2c+1], which the native kernel adds to its table products (no [B, H, Lq, Lk] bias)
        bucket_bias = torch.einsum("hd,hrd->hr", pos_bias - u, table) * d_head**-0.5
        return relative_attention(
            q + u[:, None, :], k, v, table, None, clip=clip, attn_mask=attn_mask, bucket_bias=bucket_bias,
            offset=offset, dropout_p=dropout_p,
        )


class XLPositions(PositionScheme):
    """``xl``: Transformer-XL attention in every self-attention layer."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.settings = cfg.xl
        shared = not cfg.xl.per_layer_biases
        self.encoder_biases = XLBiases(cfg.n_heads, self.d_head) if shared else None
        self.decoder_biases = XLBiases(cfg.n_heads, self.d_head) if shared else None
        self.d_model = cfg.d_model

    def self_attention(self, stack: Stack, index: int) -> XLAttention:
        shared = self.encoder_biases if stack == "encoder" else self.decoder_biases
        return XLAttention(self.d_model, self.n_heads, self.settings.clip, shared)
