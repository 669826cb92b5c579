"""Input for a model trained on Multi30k's own preprocessed text (``data.multi30k_text: tok``): lowercased,
punctuation-normalized, Moses-tokenized, with HTML escapes (``&apos;``, ``&quot;``). Such a model has never seen a
capital letter or a full stop attached to a word, and on raw sentences it translated markedly worse (literature BLEU
30.1 against 42.5 on the same 50 test sentences, raw against tokenized). ``translate`` gives it the lines that look
raw as the dataset's ``task1-tokenize.sh`` would have made them, and leaves the lines that already look tokenized
alone: tokenizing tokenized text again is not a no-op (``d&apos; une`` becomes ``d &apos; une``). The translations
of the lines it tokenized are detokenized back (``detokenize_multi30k``), so raw text in gives plain text out,
recased where a casing model is at hand (``rpr_mt.text.casing``: learned at ``prepare`` from the raw training text,
kept with the data and the checkpoint), else in lowercase; so are those of lines that look neither way (lowercase
words, no punctuation) unless their window holds tokenized text (``plain_text_lines``)."""

from __future__ import annotations

from typing import Container, Iterable, Iterator, Optional

# They live with the scoring, which applies the same choice to hypotheses and references (rpr_mt.evaluate.score).
from rpr_mt.evaluate import detokenize_multi30k, looks_tokenized, looks_untokenized, tokenize_untokenized
from rpr_mt.text.casing import Casing

__all__ = ["detokenize_multi30k", "detokenize_outputs", "looks_untokenized", "plain_text_lines", "tokenize_untokenized"]


def plain_text_lines(lines: list[str], tokenized: list[int], tokenized_before: bool = False) -> tuple[list[int], bool]:
    """The (0-based) lines of a window whose translations are detokenized, and whether the input reads as tokenized
    text (for the next window). Those ``tokenize_untokenized`` tokenized are (raw text in, plain text out); a line
    that looks neither raw nor tokenized (lowercase words, no punctuation: ``the man sits on the bench``, whose
    translation came back as ``l&apos; homme ...``) follows its window: kept in the model's form where some line of
    the window looks tokenized (``looks_tokenized``: tok/ text, about 5% of whose lines look neither way), detokenized
    where a line looked raw, and where none looks either way, as the window before it went (``tokenized_before``;
    plain text for the first). ``lines``: the window as read, before tokenizing."""
    if any(looks_tokenized(line) for line in lines):
        is_tokenized = True
    elif tokenized:
        is_tokenized = False
    else:
        is_tokenized = tokenized_before
    if is_tokenized:
        return list(tokenized), True
    return [i for i, line in enumerate(lines) if line.strip()], False


def detokenize_outputs(outputs: Iterable[str], tokenized: Container[int], nbest: int, lang: str,
                       casing: Optional[Casing] = None) -> Iterator[str]:
    """Translate's output lines (``rpr_mt.decode.translate``'s format) with the translations of the input lines
    numbered in ``tokenized`` (0-based; those ``tokenize_untokenized`` changed) detokenized back, and recased first
    with ``casing`` when given: raw text in, plain (cased) text out. Lazily: ``tokenized`` may still be filling as the
    input is read, ahead of each output. With nbest > 1 an entry's first field is its input line's number; otherwise
    the outputs are the input lines' one by one."""

    def plain(text: str) -> str:
        return detokenize_multi30k([casing.recase(text) if casing is not None else text], lang)[0]

    for position, output in enumerate(outputs):
        if nbest == 1:
            if position in tokenized:
                output = plain(output)
        else:
            index, score, text = output.split("\t", 2)
            if int(index) in tokenized:
                output = f"{index}\t{score}\t{plain(text)}"
        yield output
