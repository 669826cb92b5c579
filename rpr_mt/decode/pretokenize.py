"""Input for a model trained on Multi30k's own preprocessed text (``data.multi30k_text: tok``): lowercased,
punctuation-normalized, Moses-tokenized, with HTML escapes (``&apos;``, ``&quot;``). Such a model has never seen a
capital letter or a full stop attached to a word, and on raw sentences it translated markedly worse (literature BLEU
30.1 against 42.5 on the same 50 test sentences, raw against tokenized). ``translate`` gives it the lines that look
raw as the dataset's ``task1-tokenize.sh`` would have made them, and leaves the lines that already look tokenized
alone: tokenizing tokenized text again is not a no-op (``d&apos; une`` becomes ``d &apos; une``). The translations
of the lines it tokenized are detokenized back (``detokenize_multi30k``), so raw text in gives plain text out, in
lowercase."""

from __future__ import annotations

from typing import Container, Iterable, Iterator

# They live with the scoring, which applies the same choice to hypotheses and references (rpr_mt.evaluate.score).
from rpr_mt.evaluate import detokenize_multi30k, looks_untokenized, tokenize_untokenized

__all__ = ["detokenize_multi30k", "detokenize_outputs", "looks_untokenized", "tokenize_untokenized"]


def detokenize_outputs(outputs: Iterable[str], tokenized: Container[int], nbest: int, lang: str) -> Iterator[str]:
    """Translate's output lines (``rpr_mt.decode.translate``'s format) with the translations of the input lines
    numbered in ``tokenized`` (0-based; those ``tokenize_untokenized`` changed) detokenized back: raw text in, plain
    text out. Lazily: ``tokenized`` may still be filling as the input is read, ahead of each output. With nbest > 1 an
    entry's first field is its input line's number; otherwise the outputs are the input lines' one by one."""
    for position, output in enumerate(outputs):
        if nbest == 1:
            if position in tokenized:
                output = detokenize_multi30k([output], lang)[0]
        else:
            index, score, text = output.split("\t", 2)
            if int(index) in tokenized:
                output = f"{index}\t{score}\t{detokenize_multi30k([text], lang)[0]}"
        yield output
