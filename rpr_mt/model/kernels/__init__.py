"""How attention is computed, not what it means: the entry points and their one dispatch policy (``dispatch``),
the chunked pure-torch path (``torch_chunked``), the C row kernels as torch custom ops (``native``, ``csrc/``, built
and loaded by ``c_library``) with the chunk iteration both share (``chunks``), plain
compositions that are also the readable reference (``gather``), and the bucket geometry of Shaw et al.'s relative
positions (``geometry``). Position schemes (``rpr_mt.model.positions``) decide what goes in: tables, a bias."""

from rpr_mt.model.kernels.dispatch import choose_impl, content_attention, relative_attention

__all__ = ["choose_impl", "content_attention", "relative_attention"]
