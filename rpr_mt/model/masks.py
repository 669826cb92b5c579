"""Attention masks: boolean, True = may attend, broadcastable to [B, H, Lq, Lk].

Masked logits get ``torch.finfo(dtype).min`` (never -inf), and rows with no allowed key ("dead" rows) are
temporarily unmasked so that softmax never sees an all-masked row (NaN in the forward or backward pass); the kernels
zero their outputs afterwards, which also zeroes their gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["PreparedMask", "as_4d", "causal_mask", "mask_bias", "prepare_mask", "revive_dead_rows"]


def causal_mask(
    q_len: int, k_len: int, offset: int = 0, device: torch.device | str | None = None
) -> Tensor:
    """Boolean [q_len, k_len] mask, True = may attend: the query at absolute position offset + i may attend the
    keys j <= offset + i (keys sit at 0 .. k_len - 1). With ``offset = k_len - q_len`` this is the mask for
    ``q_len`` new tokens appended to a cache of ``offset`` positions."""
    query_pos = torch.arange(offset, offset + q_len, device=device)  # [Lq]
    key_pos = torch.arange(k_len, device=device)  # [Lk]
    return key_pos[None, :] <= query_pos[:, None]


def as_4d(mask: Tensor) -> Tensor:
    """A boolean mask of at most 4 dims as a 4-d view ([Lk] -> [1, 1, 1, Lk], ...)."""
    if mask.dtype != torch.bool:
        raise TypeError(f"attn_mask must be boolean (True = may attend), got {mask.dtype}")
    if mask.dim() > 4:
        raise ValueError(f"attn_mask must have at most 4 dims, got shape {tuple(mask.shape)}")
    return mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))


def revive_dead_rows(mask: Tensor) -> tuple[Tensor, Tensor | None]:
    """Return (mask with fully masked rows unmasked, dead-row indicator [.., Lq, 1] or None if there are none).

    Softmax of an all-masked row is meaningless (uniform, or NaN with -inf); unmasking such rows keeps every
    computation finite, and the caller zeroes their outputs (which also zeroes their gradients)."""
    dead = ~mask.any(dim=-1, keepdim=True)  # [B?, H?, Lq?, 1]
    if mask.device.type == "cpu" and not bool(dead.any()):  # the check would cost a device sync elsewhere
        return mask, None
    return mask | dead, dead


@dataclass(frozen=True)
class PreparedMask:
    """A mask as the attention kernels take it, made once for every layer that uses it: ``allowed`` 4-d with the
    dead rows revived, ``dead`` their indicator [.., Lq, 1] or None. Attention accepts it wherever it accepts a
    boolean mask. Preparing costs three small kernels on a GPU (any, not, or); each layer of a stack paid them for
    the same mask, 30 of them per update of a 6+6 model."""

    allowed: Tensor
    dead: Tensor | None

    def index_select(self, index: Tensor) -> "PreparedMask":
        """The rows of ``index`` along the batch (a mask whose batch dim is 1 is shared by all and stays)."""
        def pick(t: Tensor) -> Tensor:
            return t if t.shape[0] == 1 else t.index_select(0, index)

        return PreparedMask(pick(self.allowed), None if self.dead is None else pick(self.dead))


def prepare_mask(mask: Tensor, *, live: bool = False) -> PreparedMask:
    """``mask`` (boolean, True = may attend, broadcastable to [B, H, Lq, Lk]) prepared once (``PreparedMask``).
    ``live``: the caller knows that every row has an allowed key (a causal mask allows key 0), so nothing is
    computed."""
    mask = as_4d(mask)
    return PreparedMask(mask, None) if live else PreparedMask(*revive_dead_rows(mask))


def mask_bias(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Additive bias, 0 where allowed and finfo(dtype).min where masked (never -inf).

    Adding is an order of magnitude faster than masked_fill_ with a broadcast mask on CPU. The sum of the bias and
    a negative logit may round to -inf, which is harmless: no row is fully masked (see revive_dead_rows), so the row
    maximum is finite and exp(-inf - max) = 0."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)
