"""Parameter names of older checkpoints, renamed on load (as fairseq's ``upgrade_state_dict_named`` does).

Before position schemes became modules (rpr-mt 45231a7 and earlier), the Shaw tables were attributes of each
self-attention layer and the learned absolute table an attribute of the model.
"""

from __future__ import annotations

import re
from typing import Mapping, TypeVar

__all__ = ["upgrade_state_dict"]

T = TypeVar("T")

_RENAMES = [
    (re.compile(r"^((?:encoder|decoder)_layers\.\d+\.self_attn)\.(rel_[kv])$"), r"\1.positions.\2"),
    (re.compile(r"^learned_positions\.weight$"), "positions.absolute.learned.weight"),
]


def upgrade_state_dict(state: Mapping[str, T]) -> dict[str, T]:
    """A model state dict with old parameter names renamed to the current ones (others unchanged, order kept)."""
    upgraded = {}
    for key, value in state.items():
        for pattern, replacement in _RENAMES:
            key = pattern.sub(replacement, key)
        upgraded[key] = value
    return upgraded
