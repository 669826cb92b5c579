"""The ``PositionScheme`` of each ``model.positions``: the one map from a scheme's name to its class."""

from __future__ import annotations

from typing import Callable

from rpr_mt.config import ModelConfig
from rpr_mt.model.positions.alibi import ALiBiPositions
from rpr_mt.model.positions.base import PositionScheme
from rpr_mt.model.positions.rope import RotaryPositions
from rpr_mt.model.positions.shaw import ShawPositions
from rpr_mt.model.positions.t5 import T5Positions
from rpr_mt.model.positions.xl import XLPositions

__all__ = ["CLASSES", "build_position_scheme"]

# Every name of rpr_mt.model.positions.SCHEMES, and nothing else (tests/model/positions checks it).
CLASSES: dict[str, Callable[[ModelConfig], PositionScheme]] = {
    "relative": lambda cfg: ShawPositions(cfg),
    "absolute": lambda cfg: PositionScheme(cfg, absolute=True),
    "absolute+relative": lambda cfg: ShawPositions(cfg, absolute=True),
    "none": lambda cfg: PositionScheme(cfg),
    "t5": T5Positions,
    "xl": XLPositions,
    "rope": RotaryPositions,
    "alibi": ALiBiPositions,
}


def build_position_scheme(cfg: ModelConfig) -> PositionScheme:
    """The scheme named by ``cfg.positions``, with its settings from ``cfg``."""
    return CLASSES[cfg.positions](cfg)
