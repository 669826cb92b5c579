"""Encoder-decoder Transformer (Vaswani et al., 2017) whose order information comes from a position scheme.

``model.positions`` names the scheme (``rpr_mt.model.positions``: none, absolute, relative (Shaw et al. 2018),
absolute+relative, t5, xl, rope, alibi); it is built once and asked twice: for what to add to the embeddings, and for
the position terms of every self-attention layer. Encoder-decoder attention is content-only for every scheme, as in
Shaw et al. (2018).

The module computes logits only: no loss, no I/O. Decoding goes through the narrow protocol used by
``rpr_mt.decode.search``: ``encode`` -> ``init_decoder_state`` -> ``decode_step`` (incremental, cached).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rpr_mt.config import ModelConfig
from rpr_mt.model.attention import MultiHeadAttention
from rpr_mt.model.cache import KVCache
from rpr_mt.model.dropout import dropout
from rpr_mt.model.masks import PreparedMask, causal_mask, prepare_mask
from rpr_mt.model.positions.base import AttentionPositions
from rpr_mt.model.positions.build import build_position_scheme


@dataclass
class EncoderOutput:
    memory: Tensor  # [B, S, D]
    src_mask: Tensor  # [B, S], True = real token
    # The key-padding mask [B, 1, 1, S] of the encoder's and decoder's attention to the sources, prepared once by
    # encode; None when no source is padded (attention's fast path). Deciding it again (bool(src_mask.all())) would
    # wait for the GPU, once per forward pass in training and once per step in decoding. A selection of the rows
    # keeps a mask where none may be needed any more, which is still exact. No default: None means "nothing
    # padded", so an output built by hand from memory and src_mask alone let the decoder attend to padding silently.
    key_mask: PreparedMask | None

    @property
    def padded(self) -> bool:
        return self.key_mask is not None

    def reorder(self, index: Tensor) -> "EncoderOutput":
        key_mask = None if self.key_mask is None else self.key_mask.index_select(index)
        return EncoderOutput(self.memory.index_select(0, index), self.src_mask.index_select(0, index), key_mask)


@dataclass
class DecoderState:
    self_caches: list[KVCache]  # one per decoder layer: keys/values of the target prefix
    cross_caches: list[KVCache]  # one per decoder layer: projected encoder memory, computed once
    length: int = 0  # target positions decoded so far

    def reorder(self, index: Tensor, cross: bool = True) -> None:
        """Follow beam-search back-pointers: row b of the new state is row index[b] of the old. ``cross=False``
        leaves the cross-attention caches alone (the caller knows rows index[b] and b share their source)."""
        for cache in (*self.self_caches, *(self.cross_caches if cross else ())):
            cache.reorder(index)


class FeedForward(nn.Module):
    def __init__(self, d_model: int, ff_dim: int, activation_dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, ff_dim)
        self.fc2 = nn.Linear(ff_dim, d_model)
        self.activation_dropout = activation_dropout

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.fc1(x))
        x = dropout(x, self.activation_dropout, self.training)
        return self.fc2(x)


class Sublayer(nn.Module):
    """Residual wrapper: post-norm LN(x + drop(f(x))) as in the paper, or pre-norm x + drop(f(LN(x)))."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = dropout
        self.pre_norm = pre_norm

    def forward(self, x: Tensor, fn) -> Tensor:
        if self.pre_norm:
            return x + dropout(fn(self.norm(x)), self.dropout, self.training)
        return self.norm(x + dropout(fn(x), self.dropout, self.training))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, positions: AttentionPositions) -> None:
        super().__init__()
        pre_norm = cfg.norm == "pre"
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout, positions=positions)
        self.ff = FeedForward(cfg.d_model, cfg.ff_dim, cfg.activation_dropout)
        self.attn_block = Sublayer(cfg.d_model, cfg.dropout, pre_norm)
        self.ff_block = Sublayer(cfg.d_model, cfg.dropout, pre_norm)

    def forward(self, x: Tensor, mask: Tensor | PreparedMask | None) -> Tensor:
        x = self.attn_block(x, lambda h: self.self_attn(h, attn_mask=mask))
        return self.ff_block(x, self.ff)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, positions: AttentionPositions) -> None:
        super().__init__()
        pre_norm = cfg.norm == "pre"
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout, positions=positions)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)  # content-only
        self.ff = FeedForward(cfg.d_model, cfg.ff_dim, cfg.activation_dropout)
        self.self_block = Sublayer(cfg.d_model, cfg.dropout, pre_norm)
        self.cross_block = Sublayer(cfg.d_model, cfg.dropout, pre_norm)
        self.ff_block = Sublayer(cfg.d_model, cfg.dropout, pre_norm)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        self_mask: Tensor | PreparedMask | None,
        cross_mask: Tensor | PreparedMask | None,
        self_cache: KVCache | None = None,
        cross_cache: KVCache | None = None,
    ) -> Tensor:
        x = self.self_block(x, lambda h: self.self_attn(h, attn_mask=self_mask, cache=self_cache))
        x = self.cross_block(x, lambda h: self.cross_attn(h, memory, attn_mask=cross_mask, cache=cross_cache))
        return self.ff_block(x, self.ff)


class Seq2Seq(nn.Module):
    """Shared source/target embeddings over a joint vocabulary, tied to the output projection."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, pad_id: int = 0, bos_id: int = 2, eos_id: int = 3):
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.max_positions = cfg.max_positions
        self.embed_scale = math.sqrt(cfg.d_model)
        self.embed = nn.Embedding(vocab_size, cfg.d_model, padding_idx=pad_id)
        # fairseq's init for tied embeddings: N(0, d^-0.5) so that scaled embeddings have unit variance.
        nn.init.normal_(self.embed.weight, std=cfg.d_model**-0.5)
        with torch.no_grad():
            self.embed.weight[pad_id].zero_()
        self.positions = build_position_scheme(cfg)
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(cfg, self.positions.self_attention("encoder", i)) for i in range(cfg.encoder_layers)
        )
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(cfg, self.positions.self_attention("decoder", i)) for i in range(cfg.decoder_layers)
        )
        pre_norm = cfg.norm == "pre"
        self.encoder_norm = nn.LayerNorm(cfg.d_model) if pre_norm else nn.Identity()
        self.decoder_norm = nn.LayerNorm(cfg.d_model) if pre_norm else nn.Identity()

    # -- embeddings -------------------------------------------------------------------------------------------------

    def _embed(self, tokens: Tensor, offset: int = 0) -> Tensor:
        x = self.embed(tokens) * self.embed_scale  # [B, L, D]
        length = tokens.size(1)
        if offset + length > self.max_positions:
            raise ValueError(f"sequence of {offset + length} positions exceeds model.max_positions={self.max_positions}")
        return dropout(self.positions.embed(x, offset), self.cfg.dropout, self.training)

    # -- encoder ----------------------------------------------------------------------------------------------------

    def encode(self, src: Tensor) -> EncoderOutput:
        """src: [B, S] token ids, padded with pad_id."""
        src_mask = src.ne(self.pad_id)  # [B, S]
        padded = not bool(src_mask.all())  # the forward pass's one device sync for its masks
        # Key-padding mask for attention, [B, 1, 1, S]; None when nothing is padded lets attention take its fast path.
        key_mask = prepare_mask(src_mask[:, None, None, :]) if padded else None
        x = self._embed(src)
        for layer in self.encoder_layers:
            x = layer(x, key_mask)
        return EncoderOutput(self.encoder_norm(x), src_mask, key_mask)

    # -- decoder ----------------------------------------------------------------------------------------------------

    def decode_hidden(self, tgt_in: Tensor, enc: EncoderOutput) -> Tensor:
        """Teacher-forced decoder states before the output projection: tgt_in [B, T] -> [B, T, D]."""
        length = tgt_in.size(1)
        self_mask = prepare_mask(causal_mask(length, length, device=tgt_in.device), live=True)  # key 0 for all
        x = self._embed(tgt_in)
        for layer in self.decoder_layers:
            x = layer(x, enc.memory, self_mask, enc.key_mask)
        return self.decoder_norm(x)

    def output_logits(self, hidden: Tensor) -> Tensor:
        """Tied output projection of decoder states [..., D] -> logits [..., V]."""
        return F.linear(hidden, self.embed.weight)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Full teacher-forced logits [B, T, V] (training selects non-pad states first; see train.loss)."""
        return self.output_logits(self.decode_hidden(tgt_in, self.encode(src)))

    def init_decoder_state(self, enc: EncoderOutput) -> DecoderState:
        n = len(self.decoder_layers)
        return DecoderState([KVCache() for _ in range(n)], [KVCache() for _ in range(n)], 0)

    def decode_step(self, tokens: Tensor, enc: EncoderOutput, state: DecoderState) -> Tensor:
        """Logits [B, n, V] for n new target tokens at positions state.length..; extends the caches in state."""
        n = tokens.size(1)
        offset = state.length
        # One new token may attend to every cached position: no mask, so attention can take its fast path.
        self_mask = None if n == 1 else prepare_mask(causal_mask(n, offset + n, offset=offset, device=tokens.device),
                                                     live=True)
        x = self._embed(tokens, offset)
        for layer, self_cache, cross_cache in zip(self.decoder_layers, state.self_caches, state.cross_caches):
            x = layer(x, enc.memory, self_mask, enc.key_mask, self_cache, cross_cache)
        state.length = offset + n
        return self.output_logits(self.decoder_norm(x))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
