"""Position schemes: how a model knows the order of its tokens.

    relative           Shaw et al. (2018): learned key/value tables over clipped relative distances
    absolute           sinusoidal or learned vectors added to the embeddings (Vaswani et al. 2017)
    absolute+relative  both (Shaw et al. report no further gain, Section 4.2)
    none               no order information: the encoder is permutation-equivariant
    t5                 a learned per-head scalar per bucket of relative distance (Raffel et al. 2020)
    xl                 Transformer-XL's content/position decomposition with sinusoidal R (Dai et al. 2019)
    rope               rotary queries and keys (Su et al. 2021)
    alibi              fixed linear biases -m_h |i - j| (Press et al. 2022)

A scheme has two halves, and this package holds both:

* its declaration, a ``Scheme`` in ``schemes.py`` (no torch): the settings it reads, its own settings section, the
  rules a config must satisfy for it, and how CTranslate2 holds it. ``rpr_mt.config`` takes the choices of
  ``model.positions``, the settings sections, the warnings about ignored settings and the validation from there;
  ``rpr_mt.export.ctranslate2`` takes the export layout.
* its computation, a ``PositionScheme`` subclass in a file of its own, behind the two-part contract in ``base.py``
  (what is added to the embeddings, and each self-attention layer's ``AttentionPositions``: rotation, logit bias or
  the whole product). Every scheme decodes incrementally: the contract's offsets place cached queries and keys.
  ``build.py`` maps each name to its class; ``build_position_scheme`` is the only place that does.

A new scheme is a file with its ``PositionScheme`` subclass, its ``Scheme`` in ``schemes.py`` (with a settings
dataclass if it has settings, which ``ModelConfig`` then holds in a field of the scheme's name), a line in
``build.py``, and its tests (tests/model/positions/). The exporter changes only for a scheme that CTranslate2 holds
in a layout it does not write yet.

This module imports only the declarations, so that the config can read them without torch; import the classes
from their modules (``build``, ``base``, ``shaw``, ...).
"""

from rpr_mt.model.positions.schemes import SCHEMES, Scheme, describe_positions

__all__ = ["SCHEMES", "Scheme", "describe_positions"]
