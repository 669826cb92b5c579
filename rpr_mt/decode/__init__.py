"""Decoding: greedy and beam search (``search``) and translating lines of text (``translate``)."""

from rpr_mt.decode.search import Hypothesis, beam_search, greedy_search
from rpr_mt.decode.translate import translate_lines
from rpr_mt.lines import read_lines

__all__ = ["Hypothesis", "beam_search", "greedy_search", "read_lines", "translate_lines"]
