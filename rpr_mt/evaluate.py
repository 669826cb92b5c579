"""Translation quality: sacreBLEU and chrF (with signatures), and the paper-comparable tokenized BLEU.

Three numbers, clearly labelled because they are not interchangeable:

* ``sacrebleu``: sacreBLEU BLEU on detokenized text, default ``13a`` tokenizer, with its signature string. The
  number to report going forward (Post, 2018).
* ``chrf``: sacreBLEU chrF (character 6-grams, beta 2), with its signature.
* ``tok_bleu_compound_split``: what Vaswani et al. (2017) and Shaw et al. (2018) report, following tensor2tensor's
  ``get_ende_bleu.sh``: Moses ``tokenizer.perl -l LANG`` on hypotheses and references, then compound splitting
  ``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'``, then ``multi-bleu.perl`` (here: sacreBLEU with
  ``tokenize='none'`` and no smoothing, which computes the same corpus BLEU on whitespace tokens).

All BLEU arithmetic is sacreBLEU's; tokenization is sacremoses'. Nothing here re-implements a metric.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any, Optional

from sacrebleu.metrics import BLEU, CHRF
import sacremoses
from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer

from rpr_mt.errors import UserError
from rpr_mt.languages import ISO_639_1
from rpr_mt.text.casing import Casing

# tensor2tensor's compound splitting. ``re.ASCII`` makes ``\S`` mean "not ASCII whitespace", like Perl's ``\S`` on
# the undecoded UTF-8 bytes that ``perl -ple`` sees (so e.g. a no-break space counts as non-space in both).
_COMPOUND = re.compile(r"(\S)-(\S)", re.ASCII)

TOK_BLEU_DESCRIPTION = (
    "Moses tokenizer.perl -l {lang} + compound splitting (##AT##-##AT##) + multi-bleu.perl "
    "(tensor2tensor get_ende_bleu.sh; sacrebleu tokenize=none, smooth=none)"
)
# pretokenized text skips the tokenizer (tokenizing Moses output again would escape its escapes: &quot; -> &amp;quot;)
TOK_BLEU_PRETOKENIZED_DESCRIPTION = (
    "text already Moses-tokenized (Multi30k tok/ files) + compound splitting (##AT##-##AT##) + multi-bleu.perl "
    "(tensor2tensor get_ende_bleu.sh; sacrebleu tokenize=none, smooth=none)"
)

LC_TOK_BLEU_DESCRIPTION = (
    "Multi30k literature BLEU: {prep}, then multi-bleu.perl (sacrebleu tokenize=none, smooth=none)"
)
LC_TOK_PREP = ("lowercase + normalize-punctuation.perl -l {lang} + tokenizer.perl -l {lang} "
               f"(sacremoses {sacremoses.__version__}, as Multi30k's task1-tokenize.sh)")
LC_TOK_PRETOKENIZED = "text already lowercased, normalized and tokenized (Multi30k tok/ files)"


def language_from_path(path: str | Path) -> Optional[str]:
    """The language code a file's name ends with (``test.de``, ``test.de.gz`` -> ``de``), or None when its last
    suffix (before ``.gz``) is not an ISO 639-1 code (``ref.txt``)."""
    name = Path(path).name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    suffix = Path(name).suffix.lstrip(".")
    return suffix if suffix in ISO_639_1 else None


def split_compounds(tokenized: str) -> str:
    """``Nord-Süd-Verbindung`` -> ``Nord ##AT##-##AT## Süd ##AT##-##AT## Verbindung`` (Perl ``s///g`` semantics)."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", tokenized)


def tokenize_for_bleu(lines: list[str], lang: str) -> list[str]:
    """Moses-tokenize (as ``tokenizer.perl -l lang``, no ``-a``, default escaping) and split compounds."""
    tokenizer = MosesTokenizer(lang=lang)
    return [split_compounds(tokenizer.tokenize(line, return_str=True, escape=True)) for line in lines]


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


def tokenize_untokenized(lines: list[str], lang: str) -> tuple[list[str], list[int]]:
    """``lines`` with those that look raw lowercased, normalized and tokenized as Multi30k's tok/ files are (the
    others as they are: tokenizing that text again is not a no-op, ``&quot;`` becomes ``&amp; quot ;``), and the
    indices of those changed that way.

    Sentence by sentence: tok/ holds one sentence a line, and Moses' tokenizer separates a full stop inside a line
    only before a capital letter, which lowercasing has removed; a raw line of two sentences came out as
    ``... the street. two dogs ...``, and the model, which never saw ``street.``, dropped the full stop."""
    from rpr_mt.decode.segment import split_sentences

    raw = [i for i, line in enumerate(lines) if line.strip() and looks_untokenized(line)]
    if not raw:
        return list(lines), []
    sentences = [split_sentences(lines[i], lang) or [lines[i]] for i in raw]
    tokenized = iter(lowercase_normalize_tokenize([s for line in sentences for s in line], lang))
    out = list(lines)
    for i, parts in zip(raw, sentences):
        out[i] = " ".join(next(tokenized) for _ in parts)
    return out, raw


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


def raw_looking_lines(lines: list[str]) -> list[int]:
    """The (1-based) numbers of the lines of ``lines`` that look raw (``looks_untokenized``)."""
    return [number for number, line in enumerate(lines, 1) if line.strip() and looks_untokenized(line)]


# A file is raw text when at least this share of its lines with text look raw: Multi30k's tok/ files have a few such
# lines (an abbreviation's full stop, "ca. 120 cm": 3 of the 1,014 German dev lines, 81 of 29,000 training lines, at
# most 0.3%), raw files and detokenized translations nearly all (a capital letter, a full stop on its word).
RAW_SHARE = 0.1


def reads_as_raw(lines: list[str]) -> bool:
    """``lines`` are raw text (``RAW_SHARE`` of them look raw), not Multi30k's tokenized text, which no single line
    decides: one raw-looking line had a tok model's whole output, or its own dev reference, tokenized again (escapes
    split apart: a dev literature BLEU of 41.12 for 41.76)."""
    with_text = sum(1 for line in lines if line.strip())
    return with_text > 0 and len(raw_looking_lines(lines)) >= RAW_SHARE * with_text


def reads_as_tokenized(lines: list[str]) -> bool:
    """Some line of ``lines`` has text, and they do not read as raw (``reads_as_raw``)."""
    return any(line.strip() for line in lines) and not reads_as_raw(lines)


def _as_multi30k_tok(lines: list[str], lang: str, tokenized: bool) -> list[str]:
    """``lines`` as Multi30k's tok/ text: as they are when they are that text (a model trained on it translates into
    it, and tokenizing it again splits its escapes apart), else all of them lowercased, normalized and tokenized.
    Decided for the whole file, not line by line, so that a raw file's scores do not depend on which of its lines
    happen to look tokenized. ``tokenized``: ``reads_as_tokenized(lines)``, which the caller has."""
    if tokenized:
        return list(lines)
    return lowercase_normalize_tokenize(lines, lang)


def score(
    hypotheses: list[str],
    references: list[str],
    *,
    lang: str,
    pretokenized: bool = False,
    hyp_name: Optional[str] = None,
    ref_name: Optional[str] = None,
) -> dict[str, Any]:
    """Score ``hypotheses`` against line-aligned ``references`` in target language ``lang``: detokenized raw text,
    or, with ``pretokenized``, text that is already Multi30k's lowercased, normalized, tokenized text (both sides).
    Without it, the literature's BLEU still takes a side none of whose lines looks raw as it is
    (``_as_multi30k_tok``), so a ``tok`` model's translations can be scored against the raw references.

    Returns ``{"sacrebleu", "sacrebleu_signature", "sacrebleu_detail", "chrf", "chrf_signature",
    "tok_bleu_compound_split", "tok_bleu_description", "lc_tok_bleu", "lc_tok_bleu_signature", "lines"}`` (scores
    on the 0-100 scale). ``hyp_name``/``ref_name`` (e.g. file names) only appear in error messages.
    """
    hyp_name = hyp_name or "hypotheses"
    ref_name = ref_name or "references"
    if not hypotheses:
        raise UserError(f"{hyp_name}: no hypotheses to score (empty)")
    if len(hypotheses) != len(references):
        raise UserError(
            f"{hyp_name} has {len(hypotheses)} lines but {ref_name} has {len(references)}; they must be line-aligned"
        )

    # force on pretokenized text: sacreBLEU would warn that the (knowingly) tokenized lines look undetokenized; and
    # on hypotheses that look like Multi30k's tok/ text, a tok model's translations, which eval-bleu names in one line
    # of its own (against tokenized references: scored as they are; against raw ones: which number compares), where
    # sacreBLEU's advice ("suppress this message with the `force` parameter") named no option of this tool
    hyp_tokenized, ref_tokenized = reads_as_tokenized(hypotheses), reads_as_tokenized(references)
    bleu = BLEU(force=pretokenized or hyp_tokenized)
    bleu_result = bleu.corpus_score(hypotheses, [references])
    chrf = CHRF()
    chrf_result = chrf.corpus_score(hypotheses, [references])
    # force=True: the input is tokenized on purpose, so sacreBLEU's "looks tokenized" warning does not apply.
    tok_bleu = BLEU(tokenize="none", smooth_method="none", force=True)
    if pretokenized:  # already Moses-tokenized: only t2t's compound splitting is left to do
        tok_hyp, tok_ref = ([split_compounds(line) for line in side] for side in (hypotheses, references))
        lc_hyp, lc_ref = hypotheses, references
    else:
        tok_hyp, tok_ref = tokenize_for_bleu(hypotheses, lang), tokenize_for_bleu(references, lang)
        lc_hyp = _as_multi30k_tok(hypotheses, lang, hyp_tokenized)
        lc_ref = _as_multi30k_tok(references, lang, ref_tokenized)
    tok_result = tok_bleu.corpus_score(tok_hyp, [tok_ref])
    lc_result = tok_bleu.corpus_score(lc_hyp, [lc_ref])
    prep = LC_TOK_PRETOKENIZED if pretokenized else LC_TOK_PREP.format(lang=lang)
    return {
        # min: the geometric mean of four precisions of 1 came out as 100.00000000000004 on identical text
        "sacrebleu": min(bleu_result.score, 100.0),
        "sacrebleu_signature": str(bleu.get_signature()),
        "sacrebleu_detail": bleu_result.format(width=2),
        "chrf": min(chrf_result.score, 100.0),
        "chrf_signature": str(chrf.get_signature()),
        "tok_bleu_compound_split": min(tok_result.score, 100.0),
        "tok_bleu_description": (TOK_BLEU_PRETOKENIZED_DESCRIPTION if pretokenized
                                 else TOK_BLEU_DESCRIPTION.format(lang=lang)),
        "lc_tok_bleu": min(lc_result.score, 100.0),
        "lc_tok_bleu_signature": f"{tok_bleu.get_signature()}|prep:{'pretokenized' if pretokenized else 'lc.norm.tok'}",
        "lc_tok_bleu_description": LC_TOK_BLEU_DESCRIPTION.format(prep=prep),
        "lines": len(hypotheses),
    }


def recased_scores(hypotheses: list[str], references: list[str], lang: str, casing: Casing) -> dict[str, Any]:
    """Cased sacreBLEU and chrF of a lowercased-text model's translations (Multi30k's tok/ form) against raw, cased
    references, once detokenized and recased as ``translate`` gives them for raw input: the number comparable with
    other systems' sacreBLEU, which the lowercased form loses wherever the reference capitalises. Returns
    ``{"recased_sacrebleu", "recased_sacrebleu_signature", "recased_chrf"}``."""
    plain = detokenize_multi30k([casing.recase(line) for line in hypotheses], lang)
    bleu, chrf = BLEU(), CHRF()
    return {"recased_sacrebleu": min(bleu.corpus_score(plain, [references]).score, 100.0),
            "recased_sacrebleu_signature": str(bleu.get_signature()),
            "recased_chrf": min(chrf.corpus_score(plain, [references]).score, 100.0)}


def format_scores(scores: dict[str, Any], as_json: bool = False) -> str:
    """One JSON object (``as_json``), or a small human-readable table."""
    if as_json:
        return json.dumps(scores, ensure_ascii=False)
    return "\n".join([
        f"sacreBLEU                 {scores['sacrebleu']:6.2f}  {scores['sacrebleu_signature']}",
        f"chrF                      {scores['chrf']:6.2f}  {scores['chrf_signature']}",
        f"tok. BLEU, compound split {scores['tok_bleu_compound_split']:6.2f}  {scores['tok_bleu_description']}",
        f"Multi30k lit. BLEU        {scores['lc_tok_bleu']:6.2f}  {scores['lc_tok_bleu_signature']}; "
        f"{scores['lc_tok_bleu_description']}",
        *([f"sacreBLEU, recased        {scores['recased_sacrebleu']:6.2f}  {scores['recased_sacrebleu_signature']}; "
           f"chrF {scores['recased_chrf']:.2f}; the translations detokenized and recased with the training data's "
           "casing model, as translate gives them for raw text"] if "recased_sacrebleu" in scores else []),
        f"({scores['lines']} lines; {scores['sacrebleu_detail']})",
    ])
