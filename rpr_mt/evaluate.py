"""Translation quality: sacreBLEU and chrF (with signatures), and the paper-comparable tokenized BLEU.

Three numbers, clearly labelled because they are not interchangeable:

* ``sacrebleu``: sacreBLEU BLEU on detokenized text, default ``13a`` tokenizer, with its signature string. The
  number to report going forward (Post, 2018).
* ``chrf``: sacreBLEU chrF (character 6-grams, beta 2), with its signature.
* ``tok_bleu_compound_split``: what Vaswani et al. (2017) and Shaw et al. (2018) report, following tensor2tensor's
  ``get_ende_bleu.sh``: Moses ``tokenizer.perl -l LANG`` on hypotheses and references, then compound splitting
  ``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'``, then ``multi-bleu.perl`` (here: sacreBLEU with
  ``tokenize='none'`` and no smoothing, which computes the same corpus BLEU on whitespace tokens).

All BLEU arithmetic is sacreBLEU's; tokenization is sacremoses' (Multi30k's through rpr_mt.text.multi30k). Nothing
here re-implements a metric. Which of these numbers apply to the data at hand, and what to warn of when the two
sides of a score are in different forms, is rpr_mt.scoring's policy.
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

from sacrebleu.metrics import BLEU, CHRF
import sacremoses
from sacremoses import MosesTokenizer

from rpr_mt.errors import UserError
from rpr_mt.text.casing import Casing
from rpr_mt.text.multi30k import detokenize_multi30k, lowercase_normalize_tokenize, reads_as_tokenized

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


def split_compounds(tokenized: str) -> str:
    """``Nord-Süd-Verbindung`` -> ``Nord ##AT##-##AT## Süd ##AT##-##AT## Verbindung`` (Perl ``s///g`` semantics)."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", tokenized)


def tokenize_for_bleu(lines: list[str], lang: str) -> list[str]:
    """Moses-tokenize (as ``tokenizer.perl -l lang``, no ``-a``, default escaping) and split compounds."""
    tokenizer = MosesTokenizer(lang=lang)
    return [split_compounds(tokenizer.tokenize(line, return_str=True, escape=True)) for line in lines]


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
    """One JSON object (``as_json``), or a small human-readable table. The table leaves out the metrics that
    ``scores["not_applicable"]["metrics"]`` lists (those that do not apply to the data, ``rpr_mt.scoring``) and says
    why in one line."""
    if as_json:
        return json.dumps(scores, ensure_ascii=False)
    absent = scores.get("not_applicable", {})
    rows = [f"sacreBLEU                 {scores['sacrebleu']:6.2f}  {scores['sacrebleu_signature']}",
            f"chrF                      {scores['chrf']:6.2f}  {scores['chrf_signature']}"]
    if "tok_bleu_compound_split" not in absent.get("metrics", ()):
        rows.append(f"tok. BLEU, compound split {scores['tok_bleu_compound_split']:6.2f}  "
                    f"{scores['tok_bleu_description']}")
    if "lc_tok_bleu" not in absent.get("metrics", ()):
        rows.append(f"Multi30k lit. BLEU        {scores['lc_tok_bleu']:6.2f}  {scores['lc_tok_bleu_signature']}; "
                    f"{scores['lc_tok_bleu_description']}")
    if "recased_sacrebleu" in scores:
        rows.append(f"sacreBLEU, recased        {scores['recased_sacrebleu']:6.2f}  "
                    f"{scores['recased_sacrebleu_signature']}; chrF {scores['recased_chrf']:.2f}; the translations "
                    "detokenized and recased with the training data's casing model, as translate gives them for raw "
                    "text")
    if absent:
        rows.append(f"(not reported: {absent['reason']})")
    rows.append(f"({scores['lines']} lines; {scores['sacrebleu_detail']})")
    return "\n".join(rows)
