"""Multi30k's tokenized text (its ``tok/`` files: lowercased, punctuation-normalized, Moses-tokenized, with HTML
escapes such as ``&apos;`` and ``&quot;``): making it from raw text as the dataset's ``task1-tokenize.sh`` does,
turning it back into plain text, and telling the two forms apart, line by line and file by file.

Decoding uses these to give a model trained on that text the input it knows (rpr_mt.decode.pretokenize), scoring to
compare like with like (rpr_mt.evaluate). Tokenizing is sacremoses'; nothing here re-implements Moses.
"""

from __future__ import annotations

import functools
import re

from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer

from rpr_mt.text.segment import split_sentences

__all__ = ["RAW_SHARE", "detokenize_multi30k", "looks_tokenized", "looks_untokenized", "lowercase_normalize_tokenize",
           "plain_text_lines", "raw_looking_lines", "reads_as_raw", "reads_as_tokenized", "tokenize_untokenized"]


def lowercase_normalize_tokenize(lines: list[str], lang: str) -> list[str]:
    """Multi30k's ``task1-tokenize.sh`` on raw text: lowercase, Moses punctuation normalization, Moses tokenization
    (default escaping, as ``tokenizer.perl -l lang``)."""
    normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    # The newline: Perl sees each line with its "\n", and normalize-punctuation's rule that moves a period in front of
    # a closing quote (de, fr, ...) needs a character after the quote, which at the end of a line is that newline.
    return [tokenizer.tokenize(normalizer.normalize(line.lower() + "\n").strip(), return_str=True, escape=True)
            for line in lines]


# Moses escapes & | < > ' " [ ]: tokenized text holds these entities and never the bare characters.
_ESCAPE = re.compile(r"&(?:amp|quot|apos|lt|gt|#91|#93|#124);")
_BARE = re.compile(r"""["'<>|\[\]]|&(?!(?:amp|quot|apos|lt|gt|#91|#93|#124);)""")
# A word followed directly by punctuation and then a space or the end ("bike." "red,"): tokenized text separates
# them. Abbreviations and initials ("e.s.e.", "st.") keep their full stops in tokenized text, hence the two letters.
_ATTACHED = re.compile(r"[^\W\d_]{2}[.,!?;:](?:\s|$)")
# Punctuation standing apart as a token ("a bike ." "red , and"): the Moses tokenizer's mark, which raw text rarely has.
_SEPARATED = re.compile(r"(?:^|\s)[.,!?;:](?:\s|$)")


def looks_tokenized(line: str) -> bool:
    """Positive evidence of Multi30k's tokenized text: a Moses escape or punctuation standing apart as a token. A line
    with neither that does not ``looks_untokenized`` either (lowercase words only) could be both."""
    return bool(_ESCAPE.search(line) or _SEPARATED.search(line))


def looks_untokenized(line: str) -> bool:
    """Whether ``line`` looks like raw text rather than Multi30k's tokenized text: a capital letter, a bare quote,
    apostrophe, bracket or ampersand, or a word with punctuation attached; never a line holding Moses' escapes."""
    if _ESCAPE.search(line):
        return False
    return line != line.lower() or bool(_BARE.search(line)) or bool(_ATTACHED.search(line))


def raw_looking_lines(lines: list[str]) -> list[int]:
    """The (1-based) numbers of the lines of ``lines`` that look raw (``looks_untokenized``)."""
    return [number for number, line in enumerate(lines, 1) if line.strip() and looks_untokenized(line)]


# A file is raw text when at least this share of its lines with text look raw: Multi30k's tok/ files have a few such
# lines (an abbreviation's full stop, "ca. 120 cm": at most 0.3% of a file's lines), raw files and detokenized
# translations nearly all (a capital letter, a full stop on its word).
RAW_SHARE = 0.1


def reads_as_raw(lines: list[str]) -> bool:
    """``lines`` are raw text (``RAW_SHARE`` of them look raw), not Multi30k's tokenized text, which no single line
    decides: one raw-looking line must not have a tokenized file (a model's output, its reference) tokenized again,
    which splits its escapes apart."""
    with_text = sum(1 for line in lines if line.strip())
    return with_text > 0 and len(raw_looking_lines(lines)) >= RAW_SHARE * with_text


def reads_as_tokenized(lines: list[str]) -> bool:
    """Some line of ``lines`` has text, and they do not read as raw (``reads_as_raw``)."""
    return any(line.strip() for line in lines) and not reads_as_raw(lines)


def tokenize_untokenized(lines: list[str], lang: str) -> tuple[list[str], list[int]]:
    """``lines`` with those that look raw lowercased, normalized and tokenized as Multi30k's tok/ files are (the
    others as they are: tokenizing that text again is not a no-op, ``&quot;`` becomes ``&amp; quot ;``), and the
    (0-based) indices of those changed that way.

    Sentence by sentence: tok/ holds one sentence a line, and Moses' tokenizer separates a full stop inside a line
    only before a capital letter, which lowercasing removes; a raw line of two sentences would otherwise come out as
    ``... the street. two dogs ...``, with a ``street.`` that a model trained on tok/ text never saw."""
    raw = [i for i, line in enumerate(lines) if line.strip() and looks_untokenized(line)]
    if not raw:
        return list(lines), []
    sentences = [split_sentences(lines[i], lang) or [lines[i]] for i in raw]
    tokenized = iter(lowercase_normalize_tokenize([s for line in sentences for s in line], lang))
    out = list(lines)
    for i, parts in zip(raw, sentences):
        out[i] = " ".join(next(tokenized) for _ in parts)
    return out, raw


def plain_text_lines(lines: list[str], tokenized: list[int], tokenized_before: bool = False) -> tuple[list[int], bool]:
    """The (0-based) lines of a window whose translations are detokenized, and whether the input reads as tokenized
    text (for the next window). Those ``tokenize_untokenized`` tokenized are (raw text in, plain text out); a line
    that looks neither raw nor tokenized (lowercase words, no punctuation: ``the man sits on the bench``, whose
    translation comes back as ``l&apos; homme ...``) follows its window: kept in the model's form where some line of
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


def detokenize_multi30k(lines: list[str], lang: str) -> list[str]:
    """Lines of Multi30k's tokenized text (a tok/ model's translations) as plain text: Moses' detokenizer for
    ``lang`` joins the punctuation and apostrophes back (``l&apos; équipe .`` -> ``l'équipe.``) and undoes the
    escapes. The text stays lowercased: the model never saw a capital letter, and its case cannot be recovered."""
    detokenizer = _moses_detokenizer(lang)
    return [detokenizer.detokenize(line.split(), unescape=True) for line in lines]


@functools.lru_cache(maxsize=None)
def _moses_detokenizer(lang: str) -> MosesDetokenizer:
    """One per language: translate detokenizes line by line."""
    return MosesDetokenizer(lang=lang)
