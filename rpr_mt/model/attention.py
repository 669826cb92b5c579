"""Multi-head attention: projections, the position scheme's hooks, the KV cache, and the output projection.

What the position terms mean lives in ``rpr_mt.model.positions`` (one file a scheme); how the product is computed
lives in ``rpr_mt.model.kernels``. A self-attention layer owns its scheme's ``AttentionPositions``:

    project q, k, v  ->  rotate q and the new k (RoPE)  ->  append k, v to the cache  ->  attend (content attention
    with the scheme's logit bias, or the scheme's own product: Shaw's tables, Transformer-XL)  ->  out_proj

Without a cache (training, the encoder) nothing is cached, so the rotation is left to ``attend`` (``rotated=False``),
which does it inside the attention kernel when it can.

Encoder-decoder attention has none and is content-only. ``relative_attention`` (Shaw et al. 2018, eqs. (3)-(4)),
``causal_mask`` and ``KVCache`` are re-exported here for callers that import them from this module.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rpr_mt.model.cache import KVCache
from rpr_mt.model.kernels import content_attention, relative_attention
from rpr_mt.model.kernels.geometry import fold, place
from rpr_mt.model.masks import PreparedMask, causal_mask
from rpr_mt.model.positions.base import AttentionPositions

__all__ = ["KVCache", "MultiHeadAttention", "causal_mask", "fold", "place", "relative_attention"]


class MultiHeadAttention(nn.Module):
    """Multi-head attention whose position terms come from ``positions``.

    Args:
        d_model: model dimension; d_head = d_model / n_heads.
        n_heads: number of heads.
        dropout: dropout on the attention probabilities (training only).
        positions: the position terms of this (self-attention) layer; None = content-only (encoder-decoder
            attention).
        bias: biases in the projections.

    Parameters: ``in_proj_weight`` [3 d_model, d_model] (query, key, value projections stacked so that
    self-attention runs one matmul; cross-attention uses the query rows on the query and the key/value rows on the
    memory), ``in_proj_bias``, ``out_proj``, and the scheme's under ``positions``. Projections use Xavier-uniform
    per [d_model, d_model] block and zero biases.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        *,
        positions: AttentionPositions | None = None,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.dropout = dropout
        self.in_proj_weight = nn.Parameter(Tensor(3 * d_model, d_model))
        self.in_proj_bias = nn.Parameter(Tensor(3 * d_model)) if bias else None
        # registered before out_proj: parameters keep the order they had when the Shaw tables were attributes of
        # this module, so the optimizer state of a training checkpoint from before position schemes still fits
        self.positions = positions
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for block in self.in_proj_weight.detach().chunk(3, dim=0):
            nn.init.xavier_uniform_(block)
        nn.init.xavier_uniform_(self.out_proj.weight)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
            nn.init.zeros_(self.out_proj.bias)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}, dropout={self.dropout}"

    def _heads(self, x: Tensor, parts: int) -> tuple[Tensor, ...]:
        """[B, L, parts * d_model] -> parts tensors [B, H, L, d_head]."""
        batch, length, _ = x.shape
        return x.view(batch, length, parts, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4).unbind(0)

    def forward(
        self,
        query: Tensor,
        memory: Tensor | None = None,
        *,
        attn_mask: Tensor | PreparedMask | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """query [B, Lq, d_model]; memory None (self-attention) or [B, Lk, d_model] (cross-attention);
        attn_mask boolean broadcastable to [B, H, Lq, Lk], True = may attend (the caller builds padding/causal
        masks; with a cache, Lk counts the cached positions too). Returns [B, Lq, d_model]."""
        batch, q_len, _ = query.shape
        d = self.d_model
        cross = memory is not None or (cache is not None and cache.static)
        dropout_p = self.dropout if self.training else 0.0
        if not cross:
            offset = 0 if cache is None else cache.length  # the new queries and keys sit at offset ..
            q, k, v = self._heads(F.linear(query, self.in_proj_weight, self.in_proj_bias), 3)
            if self.positions is not None and cache is not None:  # the cache holds rotated keys (RoPE)
                q, k = self.positions.rotate(q, offset), self.positions.rotate(k, offset)
            if cache is not None:
                if cache.k is not None:
                    k = torch.cat([cache.k, k], dim=2)
                    v = torch.cat([cache.v, v], dim=2)
                cache.k, cache.v = k.contiguous(), v.contiguous()
                cache.query_offset = offset + q_len
        else:
            w_q, w_kv = self.in_proj_weight[:d], self.in_proj_weight[d:]
            b_q, b_kv = (None, None) if self.in_proj_bias is None else (self.in_proj_bias[:d], self.in_proj_bias[d:])
            (q,) = self._heads(F.linear(query, w_q, b_q), 1)
            if cache is not None and cache.k is not None:
                k, v = cache.k, cache.v
            else:
                if memory is None:
                    raise ValueError("cross-attention needs memory on the first call")
                k, v = self._heads(F.linear(memory, w_kv, b_kv), 2)
                if cache is not None:
                    cache.k, cache.v, cache.static = k.contiguous(), v.contiguous(), True
            if cache is not None:
                cache.query_offset += q_len

        if self.positions is not None and not cross:
            out = self.positions.attend(q, k, v, attn_mask=attn_mask, offset=offset, dropout_p=dropout_p,
                                        rotated=cache is not None)
        else:
            out = content_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)  # [B, H, Lq, d_head]
        return self.out_proj(out.transpose(1, 2).reshape(batch, q_len, d))
