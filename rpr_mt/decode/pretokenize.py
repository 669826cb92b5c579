"""Input for a model trained on Multi30k's own preprocessed text (``data.multi30k_text: tok``): lowercased,
punctuation-normalized, Moses-tokenized, with HTML escapes (``&apos;``, ``&quot;``). Such a model has never seen a
capital letter or a full stop attached to a word, and on raw sentences it translated markedly worse (literature BLEU
30.1 against 42.5 on the same 50 test sentences, raw against tokenized). ``translate`` gives it the lines that look
raw as the dataset's ``task1-tokenize.sh`` would have made them, and leaves the lines that already look tokenized
alone: tokenizing tokenized text again is not a no-op (``d&apos; une`` becomes ``d &apos; une``)."""

from __future__ import annotations

# They live with the scoring, which applies the same choice to hypotheses and references (rpr_mt.evaluate.score).
from rpr_mt.evaluate import looks_untokenized, tokenize_untokenized

__all__ = ["looks_untokenized", "tokenize_untokenized"]
