"""Sentences of a line: ``translate`` splits each input line into sentences, translates them, and joins each line's
translations back into one output line (models trained on single sentences stop after one or two of a paragraph's,
docs/positions.md).

The segmenter is sentencex (Wikimedia; rules, no model): lossless (its segments concatenate to the input), rules of
its own for ~30 languages and fallbacks for ~300, sentence marks of other scripts (。！？ ।  ؟ ...) in its default
rules, quotes and brackets kept whole, and fast (~10^5 lines/s).

Two corrections on top:

- Moses-tokenized text (the literature's Multi30k, ``tok/``) writes ``"`` as ``&quot;``, ``'`` as ``&apos;``, ``&`` as
  ``&amp;`` and ``|<>[]`` likewise (also the numeric ``&#34;``, ``&#39;``): sentencex sees each escape as the character
  it stands for, so a closing ``&quot;`` after a full stop stays with its sentence instead of becoming a "sentence" of
  its own, a quoted ``&quot; e.s.e. electronics &quot;`` is kept whole like ``"E.S.E. Electronics"``, and the ``;`` of
  an escape is no Greek question mark. The sentences returned are slices of the line, escapes as written.
- A segment that is a lone letter and a full stop (French ``M.`` for Monsieur, an initial) is joined to the next, as
  sentencex's French rules end a sentence there.

With these, every line of the Multi30k dev and test sets (``val``, ``test_2016_flickr``; en, de, fr; raw and ``tok/``)
comes back whole, as itself, so splitting leaves a one-sentence line's translation as it was
(tests/text/test_segment.py checks all 12,084 lines).
"""

from __future__ import annotations

import logging
import re
from typing import Optional

import sentencex

__all__ = ["join_sentences", "split_sentences"]

logger = logging.getLogger(__name__)

# Languages with sentencex rules of their own (abbreviations, sentence marks), and ISO 639-1 codes sentencex maps to
# one of them (its fallbacks.yaml). Any other code gets its default rules; said once per code.
_OWN_RULES = frozenset("am ar bg bn ca da de el en es fi fr gu hi hy it ja kk kn ml mr my nl pa pl pt ru sk ta te".split())
_FALLBACKS = {
    "ab": "ru", "an": "es", "av": "ru", "ay": "es", "ba": "ru", "bm": "fr", "ce": "ru", "co": "it", "cs": "sk", "cv": "ru",
    "gl": "pt", "gn": "es", "ht": "fr", "kl": "da", "kv": "ru", "lb": "de", "li": "nl", "ln": "fr", "mg": "fr", "oc": "ca",
    "os": "ru", "qu": "es", "rm": "de", "sa": "hi", "sg": "fr", "tt": "ru", "ty": "fr", "wa": "fr", "wo": "fr",
}
# Languages written without spaces between sentences: their translations are joined with none.
_NO_SPACE = frozenset({"zh", "ja"})

_INITIAL = re.compile(r"\w\.", re.UNICODE)  # a lone letter and a full stop: "M.", "J."
# Moses tokenizer.perl's escapes (and the numeric forms of the two quotes), and the characters they stand for.
_UNESCAPED = {"&quot;": '"', "&#34;": '"', "&apos;": "'", "&#39;": "'", "&amp;": "&", "&#124;": "|", "&lt;": "<",
              "&gt;": ">", "&#91;": "[", "&#93;": "]"}
_ESCAPE = re.compile("|".join(map(re.escape, _UNESCAPED)))
_warned: set[str] = set()


def split_sentences(line: str, lang: Optional[str]) -> list[str]:
    """The sentences of ``line`` in language ``lang`` (ISO 639-1; ``None``: not given, sentencex's default rules),
    each stripped of surrounding whitespace.

    A blank line gives ``[]``; a line with one sentence (or none ending in a sentence mark) gives
    ``[line.strip()]``, exactly what translating the whole line would encode.
    """
    text = line.strip()
    if not text:
        return []
    if lang is None:
        lang = "und"  # ISO 639-2 "undetermined": no rules of its own, so sentencex's default ones
    elif lang not in _OWN_RULES and lang not in _FALLBACKS and lang not in _warned:
        _warned.add(lang)
        logger.warning("sentence splitting: no rules for language %r; using sentencex's default rules (English "
                       "abbreviations, . ! ? and other scripts' sentence marks)", lang)
    sentences: list[str] = []
    pending = ""  # an initial carried to the next segment
    for segment in _segments(_FALLBACKS.get(lang, lang), text):
        piece = (pending + segment).strip()
        if _INITIAL.fullmatch(segment.strip()):
            pending = pending + segment
            continue
        pending = ""
        if piece:
            sentences.append(piece)
    if pending.strip():  # the line ended with an initial
        if sentences:
            sentences[-1] = f"{sentences[-1]} {pending.strip()}"
        else:
            sentences.append(pending.strip())
    return sentences


def _segments(lang: str, text: str) -> list[str]:
    """sentencex's segments of ``text``, found with each Moses/HTML escape read as the character it stands for, and
    given back as the slices of ``text`` (escapes as written) they cover."""
    if "&" not in text or not _ESCAPE.search(text):
        return list(sentencex.segment(lang, text))
    # The unescaped text, and for each of its characters (and its end) the offset in ``text`` where it starts.
    chars: list[str] = []
    starts: list[int] = []
    position = 0
    for match in _ESCAPE.finditer(text):
        chars.extend(text[position:match.start()])
        starts.extend(range(position, match.start()))
        chars.append(_UNESCAPED[match.group()])
        starts.append(match.start())
        position = match.end()
    chars.extend(text[position:])
    starts.extend(range(position, len(text) + 1))
    plain = "".join(chars)
    pieces: list[str] = []
    cursor = 0  # in ``plain``
    for segment in sentencex.segment(lang, plain):
        if not segment:
            continue
        found = plain.find(segment, cursor)
        if found < 0:  # not a slice of its input (sentencex is lossless; never seen): no correction
            return list(sentencex.segment(lang, text))
        end = found + len(segment)
        pieces.append(text[starts[cursor]:starts[end]])  # from the previous end: whitespace between stays with it
        cursor = end
    if cursor < len(plain):  # anything sentencex left out at the end
        if pieces:
            pieces[-1] += text[starts[cursor]:]
        else:
            pieces.append(text)
    return pieces


def join_sentences(translations: list[str], lang: Optional[str]) -> str:
    """One output line from a line's translated sentences, in target language ``lang``: one space between them, or
    none for a language written without spaces (Chinese, Japanese). One translation comes back as it is, blanks
    included, as translating the line whole gives it."""
    if len(translations) == 1:
        return translations[0]
    return ("" if lang in _NO_SPACE else " ").join(t.strip() for t in translations if t.strip())
