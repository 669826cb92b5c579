"""Recasing lowercased, Moses-tokenized text: a model trained on Multi30k's tok/ files (lowercased, normalized,
tokenized) translates into lowercase, which cased metrics (sacreBLEU, chrF) count as wrong wherever the reference
capitalises, and German capitalises every noun.

The casing model is learned from the cased, tokenized target side of the same training data, as Moses'
``train-truecaser.perl`` does (sacremoses' ``MosesTruecaser``): for every token, the form it takes most often where
its case is its own, that is not at the start of a sentence. Applied to lowercased tokenized text (``Casing.recase``),
each token takes its most frequent form, and the first letter of each sentence is capitalised.

Stored as a small JSON file (``FILE_NAME``) of the tokens whose most frequent form is not their lowercase one, keys
sorted, so that the same training text gives the same bytes.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from sacremoses import MosesPunctNormalizer, MosesTokenizer, MosesTruecaser

FILE_NAME = "casing.json"  # the casing model's name in a prepared data directory
FORMAT = "rpr-mt casing 1"  # the file's "format": another value is refused, not misread

# Tokens that end a sentence (the next word is capitalised); Moses' truecaser counts ":" too, but after a colon
# German and French go on in lowercase as often as not.
_SENTENCE_END = frozenset({".", "!", "?"})
# Moses' escapes, skipped when looking for a sentence's first letter (``&quot;ein`` -> ``&quot;Ein``)
_ESCAPES = re.compile(r"&(?:amp|quot|apos|lt|gt|#91|#93|#124);")


class CasingError(ValueError):
    """A casing model file that cannot be read (the message names the file)."""


@dataclass(frozen=True)
class Casing:
    """A casing model: ``words`` maps a lowercased token to its most frequent form, for the tokens whose most
    frequent form is not lowercase; every other token stays as it is."""

    lang: str  # the language of the text it was learned from
    words: dict[str, str] = field(default_factory=dict)

    def recase(self, line: str) -> str:
        """One line of lowercased, tokenized text (tokens apart, one space between) with each token in its most
        frequent form and the first letter of each sentence capitalised. A token with a capital already is kept."""
        tokens = line.split()
        at_start = True
        for i, token in enumerate(tokens):
            if token in _SENTENCE_END:
                at_start = True
                continue
            if token == token.lower():
                token = self.words.get(token, token)
            if at_start:
                capitalised = capitalise(token)
                at_start = capitalised is None  # no letter (a quote, a bracket, a number): the next token starts it
                token = capitalised or token
            tokens[i] = token
        return " ".join(tokens)

    def to_json(self) -> str:
        """The file's text: the same model gives the same bytes."""
        return json.dumps({"format": FORMAT, "lang": self.lang, "words": dict(sorted(self.words.items()))},
                          ensure_ascii=False, indent=0, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, origin: str) -> "Casing":
        """The model a file's text holds (``origin`` names it in errors)."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CasingError(f"{origin}: not a casing model (invalid JSON: {exc})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else None
            raise CasingError(f"{origin}: not a casing model (format {found!r}, expected {FORMAT!r})")
        words, lang = data.get("words"), data.get("lang")
        if not isinstance(lang, str) or not isinstance(words, dict) \
                or not all(isinstance(k, str) and isinstance(v, str) and k == v.lower() for k, v in words.items()):
            raise CasingError(f"{origin}: not a casing model (a 'lang' string and 'words' mapping lowercase tokens to "
                              "their cased forms expected)")
        return cls(lang, dict(words))


def capitalise(token: str) -> str | None:
    """``token`` with its first letter (after any leading Moses escapes and punctuation) in upper case, or None when it
    has no letter. A letter whose upper case is two (``ß`` -> ``SS``) is left as it is."""
    position = 0
    while position < len(token):
        escape = _ESCAPES.match(token, position)
        if escape:
            position = escape.end()
            continue
        char = token[position]
        if char.isalpha():
            upper = char.upper()
            return token[:position] + (upper if len(upper) == 1 else char) + token[position + 1:]
        position += 1
    return None


def learn(tokenized_lines: Iterable[str], lang: str) -> Casing:
    """The casing model of cased, tokenized text (one sentence or segment a line, tokens apart): Moses'
    ``train-truecaser.perl`` rule, sacremoses' port (sentence-initial tokens are not counted); ties go to the form
    seen first."""
    counts = MosesTruecaser().train(line.split() for line in tokenized_lines)["casing"]
    words = {}
    for lowered, forms in counts.items():
        best = forms.most_common(1)[0][0]
        if best != lowered:
            words[lowered] = best
    return Casing(lang, words)


def tokenize_cased(lines: Iterable[str], lang: str) -> list[str]:
    """Raw lines normalized and tokenized as Multi30k's ``task1-tokenize.sh`` makes its tok/ files
    (``normalize-punctuation.perl -l lang``, ``tokenizer.perl -l lang`` with its escapes), but not lowercased: the
    text a casing model for those files learns from."""
    normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    # the newline: Perl sees each line with its "\n", which normalization's rule for a closing quote needs
    return [tokenizer.tokenize(normalizer.normalize(line + "\n").strip(), return_str=True, escape=True)
            for line in lines]


def save(casing: Casing, path: str | Path) -> None:
    """Write ``casing`` to ``path`` atomically (a temporary file beside it, then renamed over it)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(casing.to_json())
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would keep a shared data directory's casing model from its other users
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: str | Path) -> Casing:
    """The casing model in ``path`` (CasingError when it is not one or cannot be read)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CasingError(f"{path}: cannot read the casing model ({exc})") from None
    return Casing.from_json(text, str(path))
