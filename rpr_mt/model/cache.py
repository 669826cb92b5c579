"""The key/value cache of incremental decoding."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

__all__ = ["KVCache"]


@dataclass
class KVCache:
    """Projected keys/values kept between incremental decoding calls of one ``MultiHeadAttention``.

    Self-attention (``memory`` is None): every call appends its new keys/values ([B, H, Lnew, d_head], after the
    position scheme's rotation, if any) and its queries sit at positions ``length .. length + Lq - 1``, where
    ``length`` is the number of cached positions before the call; several new tokens per call are fine (pass
    ``causal_mask(Lq, length + Lq, offset=length)``).

    Cross-attention (``memory`` given on the first call): the first call projects the memory and stores it, and
    ``static`` becomes True; later calls reuse it, whether ``memory`` is passed again (it is then ignored) or None.

    ``query_offset`` counts the queries seen so far (the position of the next query); for self-attention it
    equals ``length`` before each call.
    """

    k: Tensor | None = None  # [B, H, L, d_head]
    v: Tensor | None = None  # [B, H, L, d_head]
    static: bool = False
    query_offset: int = 0

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.size(2)

    def reorder(self, index: Tensor) -> "KVCache":
        """Select batch rows (beam-search back-pointers): row b becomes old row index[b]. In place; returns self."""
        if self.k is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)
        return self
