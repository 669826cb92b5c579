"""What each position scheme is, reads and supports: the declarations the config and the exporter ask.

One ``Scheme`` per value of ``model.positions``, in ``SCHEMES``. It declares

    reads        the ``ModelConfig`` settings it reads beyond those every scheme reads (a nested section by its
                 name, ``t5``); the config warns about the others when they are given, and a resumed run or an
                 average may change them (``rpr_mt.config.unused_model_settings``)
    settings     its own settings section, a dataclass held in ``ModelConfig`` under the scheme's name (``model.t5``),
                 whose ``problem()`` says what is wrong with its values
    problem      what a whole model config must satisfy for this scheme, beyond the types (``rpr_mt.config``
                 validates with it)
    ctranslate2  how CTranslate2 holds it: one of the ``CT2_*`` layouts below, or a refusal that says why not and
                 what to train instead (``rpr_mt.export.ctranslate2`` writes each layout)

What a scheme computes is its ``PositionScheme`` class (``base.py``; one file a scheme), which ``build.py`` maps to
its name. This module imports nothing of rpr_mt and not torch: ``rpr_mt.config`` (below the model) reads it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional, Union

__all__ = ["CT2_ALIBI_BIAS", "CT2_ENCODINGS", "CT2_ROTARY", "CT2_SHAW", "CT2_T5_BIAS", "SCHEMES", "RotarySettings",
           "Scheme", "SchemeName", "T5Settings", "Unexportable", "XLSettings", "describe_positions"]

# ``ModelConfig`` is written ``Any`` here: rpr_mt.config imports this module, not the other way round.

# How CTranslate2 holds the positions of a model (rpr_mt.export.ctranslate2 writes each):
CT2_ENCODINGS = "encodings"  # a position table added to the embeddings (zeros when there is none)
CT2_SHAW = "shaw"  # relative_position_keys / _values [2k+1, d_head] in every self-attention layer, shared by heads
CT2_T5_BIAS = "t5 bias"  # relative_attention_bias: the stack's learned [buckets, H] table and its max distance
CT2_ALIBI_BIAS = "alibi bias"  # relative_attention_bias: ALiBi's -m_h * distance as exact T5 buckets (both stacks)
CT2_ROTARY = "rotary"  # rotary embeddings over the whole head dimension, half-split (non-interleaved) layout


@dataclass(frozen=True)
class Unexportable:
    """A model CTranslate2 cannot hold exactly: why, and what to train instead, in one line."""

    reason: str


# ----------------------------------------------------------------------------------------------------------------
# Settings sections
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class T5Settings:
    """model.positions = t5 (Raffel et al. 2020): a learned scalar per head and bucket of relative distance."""

    num_buckets: int = 32  # buckets of relative distance (half per direction in the encoder)
    max_distance: int = 128  # distances from here on share the last bucket of their direction
    per_layer: bool = False  # one bias table per layer instead of one per stack (T5 shares it)

    def problem(self) -> Optional[str]:
        if not (self.num_buckets >= 4 and self.num_buckets % 2 == 0):
            return f"model.t5.num_buckets must be an even number >= 4 (got {self.num_buckets})"
        if not self.max_distance > self.num_buckets // 2:
            return f"model.t5.max_distance must exceed model.t5.num_buckets / 2 (got {self.max_distance})"
        return None


@dataclass
class XLSettings:
    """model.positions = xl (Dai et al. 2019): content/position decomposition with sinusoidal R and biases u, v."""

    clip: Optional[int] = None  # clip relative distances at this k (null: every distance in the call has its own R)
    per_layer_biases: bool = False  # u and v per layer instead of shared by the layers of a stack (the paper)

    def problem(self) -> Optional[str]:
        if self.clip is not None and self.clip < 0:
            return f"model.xl.clip must be >= 0 or null (got {self.clip})"
        return None


@dataclass
class RotarySettings:
    """model.positions = rope (Su et al. 2021): queries and keys rotated by their positions."""

    base: float = 10000.0  # theta: dimension pair m turns by position * base^(-2m/d_head)

    def problem(self) -> Optional[str]:
        if not (math.isfinite(self.base) and self.base > 1.0):
            return f"model.rope.base must be > 1 (got {self.base})"
        return None


# ----------------------------------------------------------------------------------------------------------------
# The schemes
# ----------------------------------------------------------------------------------------------------------------


def _no_problem(cfg: Any) -> Optional[str]:
    return None


@dataclass(frozen=True)
class Scheme:
    """One value of ``model.positions``: what it reads, its settings and checks, and how it exports."""

    name: str  # the value of model.positions
    module: str  # the file of rpr_mt/model/positions that computes it
    ctranslate2: Callable[[Any], Union[str, Unexportable]]  # a CT2_* layout for a ModelConfig, or why not
    reads: tuple[str, ...] = ()  # ModelConfig settings read beyond those every scheme reads
    settings: Optional[type] = None  # its settings section, ModelConfig's field of the scheme's name
    problem: Callable[[Any], Optional[str]] = _no_problem  # what a ModelConfig must satisfy, beyond its types


_SHAW_READS = ("clip", "use_key", "use_value", "share_across_heads")


def _shaw_problem(cfg: Any) -> Optional[str]:
    return None if cfg.use_key or cfg.use_value else "model.use_key and model.use_value cannot both be false"


def _relative_ctranslate2(cfg: Any) -> Union[str, Unexportable]:
    # k = 0 is no order information at all: q . aK[0] is the same for every key, which the softmax ignores, and
    # aV[0] is added to every output row (the weights sum to 1), a constant folded into the output bias
    if cfg.clip == 0:
        return CT2_ENCODINGS
    if not cfg.share_across_heads and cfg.n_heads > 1:
        return Unexportable(
            "relative position tables per head (model.share_across_heads=false, the paper's base model) cannot be "
            "exported to CTranslate2, which holds one [2k+1, d_head] key and value table per layer shared by all "
            "heads; train with --set model.share_across_heads=true instead")
    return CT2_SHAW


def _absolute_relative_ctranslate2(cfg: Any) -> Union[str, Unexportable]:
    if cfg.clip == 0:
        return CT2_ENCODINGS
    return Unexportable(
        "model.positions=absolute+relative cannot be exported to CTranslate2: a stack whose self-attention has "
        "relative positions ignores absolute position encodings there; train with --set model.positions=relative "
        "(or absolute) instead")


def _t5_ctranslate2(cfg: Any) -> Union[str, Unexportable]:
    if cfg.t5.per_layer:
        return Unexportable(
            "model.t5.per_layer=true cannot be exported to CTranslate2, which computes the T5 bias of a stack once, "
            "from its first layer's table; train with --set model.t5.per_layer=false instead")
    return CT2_T5_BIAS


def _xl_ctranslate2(cfg: Any) -> Union[str, Unexportable]:
    return Unexportable(
        "model.positions=xl cannot be exported to CTranslate2: Transformer-XL's position term (q_i + v) . W_R R_{i-j} "
        "takes another query than the content term (q_i + u) and a projected table per head, and CTranslate2's "
        "relative attention has one shared key table and one query; train with --set model.positions=relative "
        "--set model.share_across_heads=true (or t5, rope) instead")


def _rope_problem(cfg: Any) -> Optional[str]:
    d_head = cfg.d_model // cfg.n_heads
    if d_head % 2:
        return f"model.positions=rope needs an even head dimension (d_model / n_heads = {d_head})"
    return None


# In the order the config lists them (its error messages and the tests' parametrisations follow it).
SCHEMES: dict[str, Scheme] = {scheme.name: scheme for scheme in (
    Scheme("relative", "shaw.py", _relative_ctranslate2, reads=_SHAW_READS, problem=_shaw_problem),
    Scheme("absolute", "absolute.py", lambda cfg: CT2_ENCODINGS, reads=("absolute_kind",)),
    Scheme("absolute+relative", "shaw.py", _absolute_relative_ctranslate2, reads=("absolute_kind", *_SHAW_READS),
           problem=_shaw_problem),
    Scheme("none", "base.py", lambda cfg: CT2_ENCODINGS),
    Scheme("t5", "t5.py", _t5_ctranslate2, reads=("t5",), settings=T5Settings),
    Scheme("xl", "xl.py", _xl_ctranslate2, reads=("xl",), settings=XLSettings),
    Scheme("rope", "rope.py", lambda cfg: CT2_ROTARY, reads=("rope",), settings=RotarySettings, problem=_rope_problem),
    Scheme("alibi", "alibi.py", lambda cfg: CT2_ALIBI_BIAS),
)}

# The type of ModelConfig.positions: one of the names above.
SchemeName = Literal[tuple(SCHEMES)]  # type: ignore[valid-type]


def describe_positions(cfg: Any) -> str:
    """``cfg.positions`` as a report names it: "learned absolute" for a learned table of absolute vectors, the
    scheme's name otherwise (absolute alone is the paper's sinusoids)."""
    learned = cfg.absolute_kind == "learned" and "absolute_kind" in SCHEMES[cfg.positions].reads
    return f"learned {cfg.positions}" if learned else cfg.positions
