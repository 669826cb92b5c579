"""Position schemes: how a model knows the order of its tokens. One file a scheme, behind the two-part contract in
``base.py``; ``build_position_scheme`` is the only place that maps ``model.positions`` to a class.

    none               no order information: the encoder is permutation-equivariant
    absolute           sinusoidal or learned vectors added to the embeddings (Vaswani et al. 2017)
    relative           Shaw et al. (2018): learned key/value tables over clipped relative distances
    absolute+relative  both (Shaw et al. report no further gain, Section 4.2)
    t5                 a learned per-head scalar per bucket of relative distance (Raffel et al. 2020)
    xl                 Transformer-XL's content/position decomposition with sinusoidal R (Dai et al. 2019)
    rope               rotary queries and keys (Su et al. 2021)
    alibi              fixed linear biases -m_h |i - j| (Press et al. 2022)

A new scheme is a new file with a ``PositionScheme`` subclass, a line in ``SCHEMES``, its name in the config's
``positions`` choices, and its test.
"""

from __future__ import annotations

from typing import Callable

from rpr_mt.config import SCHEME_SETTINGS, ModelConfig
from rpr_mt.model.positions.absolute import AbsoluteEncoding, sinusoidal_positions, sinusoids
from rpr_mt.model.positions.alibi import ALiBiPositions, alibi_slopes
from rpr_mt.model.positions.base import AttentionPositions, PositionScheme, Stack
from rpr_mt.model.positions.rope import RotaryPositions
from rpr_mt.model.positions.shaw import ShawPositions, ShawTables, relative_position_index
from rpr_mt.model.positions.t5 import T5Positions, t5_relative_bucket
from rpr_mt.model.positions.xl import XLPositions

__all__ = [
    "SCHEMES",
    "AbsoluteEncoding",
    "AttentionPositions",
    "PositionScheme",
    "ShawTables",
    "Stack",
    "alibi_slopes",
    "build_position_scheme",
    "describe_positions",
    "relative_position_index",
    "sinusoidal_positions",
    "sinusoids",
    "t5_relative_bucket",
]

SCHEMES: dict[str, Callable[[ModelConfig], PositionScheme]] = {
    "none": lambda cfg: PositionScheme(cfg),
    "absolute": lambda cfg: PositionScheme(cfg, absolute=True),
    "relative": lambda cfg: ShawPositions(cfg),
    "absolute+relative": lambda cfg: ShawPositions(cfg, absolute=True),
    "t5": T5Positions,
    "xl": XLPositions,
    "rope": RotaryPositions,
    "alibi": ALiBiPositions,
}


def build_position_scheme(cfg: ModelConfig) -> PositionScheme:
    """The scheme named by ``cfg.positions``, with its settings from ``cfg``."""
    return SCHEMES[cfg.positions](cfg)


def describe_positions(cfg: ModelConfig) -> str:
    """``cfg.positions`` as a report names it: "learned absolute" for a learned table of absolute vectors, the
    scheme's name otherwise (absolute alone is the paper's sinusoids)."""
    learned = cfg.absolute_kind == "learned" and cfg.positions in SCHEME_SETTINGS["absolute_kind"]
    return f"learned {cfg.positions}" if learned else cfg.positions
