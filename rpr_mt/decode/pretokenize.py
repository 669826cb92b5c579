"""Input for a model trained on Multi30k's own preprocessed text (``data.multi30k_text: tok``): lowercased,
punctuation-normalized, Moses-tokenized, with HTML escapes (``&apos;``, ``&quot;``). Such a model has never seen a
capital letter or a full stop attached to a word, and translates raw sentences markedly worse (literature BLEU 30.1
against 42.5 on the same 50 test sentences, raw against tokenized). ``translate`` gives it the lines that look raw as the dataset's ``task1-tokenize.sh``
would have made them, and leaves the lines that already look tokenized alone: tokenizing tokenized text again is not a
no-op (``d&apos; une`` becomes ``d &apos; une``). The translations of the lines it tokenized are detokenized back
(``detokenize_outputs``), so raw text in gives plain text out, recased where a casing model is at hand
(``rpr_mt.text.casing``: learned at ``prepare`` from the raw training text, kept with the data and the checkpoint),
else in lowercase; so are those of lines that look neither way (lowercase words, no punctuation) unless their window
holds tokenized text (``plain_text_lines``).

The text rules themselves (what looks raw, how Multi30k tokenizes) are rpr_mt.text.multi30k's; this module applies
them to translate's input windows and output lines."""

from __future__ import annotations

import dataclasses
from typing import Callable, Container, Iterable, Iterator, Optional

from rpr_mt.decode import arriving
from rpr_mt.text.casing import Casing
from rpr_mt.text.multi30k import detokenize_multi30k, plain_text_lines, tokenize_untokenized

__all__ = ["RawLines", "TokenizedAsMulti30k", "detokenize_outputs", "note_tokenized"]


@dataclasses.dataclass
class RawLines:
    """What ``TokenizedAsMulti30k`` did, counted as the windows go by: the (0-based) numbers of the input lines it
    tokenized, of those whose translations are plain text (``plain_text_lines``), and how many lines it has read."""

    tokenized: set[int] = dataclasses.field(default_factory=set)
    plain: set[int] = dataclasses.field(default_factory=set)
    read: int = 0


class TokenizedAsMulti30k:
    """``lines`` with those that look raw tokenized as Multi30k's tok/ text (``tokenize_untokenized``), a window at a
    time (``take_window``, as translation takes them), so translation still reads one window before it writes; what
    it did is recorded in ``raw``. Says when its next line arrives as its input does (``more_within``), so that
    arriving input still ends translation's windows early."""

    def __init__(self, lines: Iterator[str], lang: str, window: int, raw: RawLines) -> None:
        self._lines, self._lang, self._window, self._raw = lines, lang, window, raw
        self._tokenized_text = False  # whether the last window read as tokenized text (plain_text_lines)
        self._chunk: list[str] = []

    def __iter__(self) -> "TokenizedAsMulti30k":
        return self

    def __next__(self) -> str:
        if not self._chunk:
            given = arriving.take_window(self._lines, self._window)
            if not given:
                raise StopIteration
            chunk, changed = tokenize_untokenized(given, self._lang)
            self._raw.tokenized.update(self._raw.read + i for i in changed)
            plain, self._tokenized_text = plain_text_lines(given, changed, self._tokenized_text)
            self._raw.plain.update(self._raw.read + i for i in plain)
            self._raw.read += len(chunk)
            self._chunk = chunk[::-1]
        return self._chunk.pop()

    def arrives_within(self, seconds: Optional[float]) -> bool:
        return bool(self._chunk) or arriving.more_within(self._lines, seconds)


def note_tokenized(raw: RawLines, detokenized: bool, report: Callable[[str], None], so_far: str = "",
                   recase: bool = True, recased: bool = False) -> None:
    """Say how many input lines ``TokenizedAsMulti30k`` tokenized: said at the end (or at an interrupt, of the lines
    read until then, ``so_far``), and whether their translations were recased (``recase``: asked to; ``recased``:
    done)."""
    if raw.tokenized:
        if not detokenized:
            form = "their translations are in that form ("
        elif recased:
            form = ("their translations detokenized back and recased with the casing model learned from the training "
                    "data's raw text (--no-recase: lowercase; --no-detokenize: in the tokenized form; ")
        elif recase:
            form = ("their translations detokenized back, still lowercase: neither the checkpoint nor its prepared "
                    "data has a casing model (`rpr-mt prepare` with the run's config adds one to the data) "
                    "(--no-detokenize: in the tokenized form; ")
        else:
            form = "their translations detokenized back, lowercase (--no-detokenize: in the tokenized form; "
        report(f"note: {len(raw.tokenized)} of {raw.read} input lines{so_far} looked like raw text; this model was "
               "trained on Multi30k's lowercased, Moses-tokenized text, so they were lowercased, normalized and "
               f"tokenized as that text was, and {form}--no-tokenize: lines as given)")


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
