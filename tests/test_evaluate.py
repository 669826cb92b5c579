"""Scoring: sacreBLEU/chrF agree with sacrebleu itself; Moses tokenization + compound splitting as tensor2tensor."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import sacrebleu

from rpr_mt.errors import UserError
from rpr_mt.evaluate import format_scores, score, split_compounds, tokenize_for_bleu

HYPS = [
    "Ein Mann fährt mit dem Fahrrad über die Nord-Süd-Brücke.",
    "Zwei Hunde spielen im Schnee.",
    "Eine Frau liest ein Buch in der Küche.",
]
REFS = [
    "Ein Mann fährt mit seinem Fahrrad über die Nord-Süd-Brücke.",
    "Zwei Hunde spielen im tiefen Schnee.",
    "Eine Frau liest in der Küche ein Buch.",
]


def test_bleu_and_chrf_equal_sacrebleu() -> None:
    scores = score(HYPS, REFS, lang="de")
    assert scores["sacrebleu"] == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score)
    assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score)
    assert "tok:13a" in scores["sacrebleu_signature"] and "nrefs:1" in scores["sacrebleu_signature"]
    assert "nc:6" in scores["chrf_signature"]
    assert scores["lines"] == 3


def test_tokenized_bleu_is_bleu_on_split_moses_tokens() -> None:
    scores = score(HYPS, REFS, lang="de")
    expected = sacrebleu.corpus_bleu(
        tokenize_for_bleu(HYPS, "de"), [tokenize_for_bleu(REFS, "de")], tokenize="none", smooth_method="none",
        force=True,
    ).score
    assert scores["tok_bleu_compound_split"] == pytest.approx(expected)
    # Splitting "Nord-Süd-Brücke" into five matching tokens raises tokenized BLEU above sacreBLEU here.
    assert scores["tok_bleu_compound_split"] != pytest.approx(scores["sacrebleu"])


def test_compound_splitting_of_german() -> None:
    [tokenized] = tokenize_for_bleu(["Die Nord-Süd-Verbindung ist gut."], "de")
    assert tokenized == "Die Nord ##AT##-##AT## Süd ##AT##-##AT## Verbindung ist gut ."
    # Perl's s///g does not re-scan consumed characters: "a-b-c" splits only once.
    assert split_compounds("a-b-c x -y z- 3-4") == "a ##AT##-##AT## b-c x -y z- 3 ##AT##-##AT## 4"


@pytest.mark.skipif(shutil.which("perl") is None, reason="perl not installed")
def test_compound_splitting_matches_the_perl_one_liner() -> None:
    text = "a-b-c Nord-Süd-Verbindung 1-2-3-4 -x y- é-ü E-Mail-Adresse\u00a0-z"
    perl = subprocess.run(
        ["perl", "-ple", r"s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g"], input=text.encode(), capture_output=True, check=True
    ).stdout.decode().rstrip("\n")
    assert split_compounds(text) == perl


def test_perfect_hypotheses_score_100() -> None:
    scores = score(REFS, REFS, lang="de")
    assert scores["sacrebleu"] == pytest.approx(100.0)
    assert scores["chrf"] == pytest.approx(100.0)
    assert scores["tok_bleu_compound_split"] == pytest.approx(100.0)


def test_line_count_mismatch_is_a_user_error() -> None:
    with pytest.raises(UserError, match=r"hyp\.de has 3 lines but ref\.de has 2"):
        score(HYPS, REFS[:2], lang="de", hyp_name="hyp.de", ref_name="ref.de")


def test_no_hypotheses_is_a_user_error() -> None:
    with pytest.raises(UserError, match="no hypotheses"):
        score([], [], lang="de")


def test_format_scores() -> None:
    scores = score(HYPS, REFS, lang="de")
    assert json.loads(format_scores(scores, as_json=True)) == scores
    text = format_scores(scores, as_json=False)
    assert f"{scores['sacrebleu']:.2f}" in text and scores["sacrebleu_signature"] in text
    assert f"{scores['tok_bleu_compound_split']:.2f}" in text and "compound" in text
