"""Input for a model trained on Multi30k's own preprocessed text (``data.multi30k_text: tok``): lowercased,
punctuation-normalized, Moses-tokenized, with HTML escapes (``&apos;``, ``&quot;``). Such a model has never seen a
capital letter or a full stop attached to a word, and on raw sentences it translated markedly worse (literature BLEU
30.1 against 42.5 on the same 50 test sentences, raw against tokenized). ``translate`` gives it the lines that look
raw as the dataset's ``task1-tokenize.sh`` would have made them, and leaves the lines that already look tokenized
alone: tokenizing tokenized text again is not a no-op (``d&apos; une`` becomes ``d &apos; une``)."""

from __future__ import annotations

import re

__all__ = ["looks_untokenized", "tokenize_untokenized"]

# Moses escapes & | < > ' " [ ]: tokenized text holds these entities and never the bare characters.
_ESCAPE = re.compile(r"&(?:amp|quot|apos|lt|gt|#91|#93|#124);")
_BARE = re.compile(r"""["'<>|\[\]]|&(?!(?:amp|quot|apos|lt|gt|#91|#93|#124);)""")
# A word followed directly by punctuation and then a space or the end ("bike." "red,"): tokenized text separates
# them. Abbreviations and initials ("e.s.e.", "st.") keep their full stops in tokenized text, hence the two letters.
_ATTACHED = re.compile(r"[^\W\d_]{2}[.,!?;:](?:\s|$)")


def looks_untokenized(line: str) -> bool:
    """Whether ``line`` looks like raw text rather than Multi30k's tokenized text: a capital letter, a bare quote,
    apostrophe, bracket or ampersand, or a word with punctuation attached; never a line holding Moses' escapes."""
    if _ESCAPE.search(line):
        return False
    return line != line.lower() or bool(_BARE.search(line)) or bool(_ATTACHED.search(line))


def tokenize_untokenized(lines: list[str], lang: str) -> tuple[list[str], int]:
    """``lines`` with those that look raw lowercased, normalized and tokenized as Multi30k's tok/ files are (the
    others as they are), and how many were changed that way."""
    from rpr_mt.evaluate import lowercase_normalize_tokenize  # sacremoses: only when a line needs it

    raw = [i for i, line in enumerate(lines) if line.strip() and looks_untokenized(line)]
    if not raw:
        return list(lines), 0
    out = list(lines)
    for i, tokenized in zip(raw, lowercase_normalize_tokenize([lines[i] for i in raw], lang)):
        out[i] = tokenized
    return out, len(raw)
