"""What eval-bleu scores and says (rpr_mt.scoring): the metrics that apply to the data at hand, and the warnings
where a score's two sides are in different forms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rpr_mt.cli import app
from rpr_mt.errors import UserError
from rpr_mt.evaluate import format_scores, score
from rpr_mt.scoring import (NOT_APPLYING, applicable, data_source_of, form_warnings, language_from_path,
                            score_files)

runner = CliRunner()
REFS = ["ta kato-n ko mira-ta .", "ta kato-n ko mira-ta ."]
HYPS = ["ta kato-n ko mira-ta .", "ta kato-n mira-ta ."]


def _prepared(tmp_path: Path, source: str) -> Path:
    """A prepared data directory of ``source`` (its manifest as prepare writes it) holding the reference test.de."""
    data = tmp_path / source
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps({"source": source, "files": ["test.de"]}), encoding="utf-8")
    (data / "test.de").write_text("\n".join(REFS) + "\n", encoding="utf-8")
    return data / "test.de"


def test_the_language_of_a_file_is_its_last_suffix():
    assert [language_from_path(name) for name in ("test.de", "x/test.DE.gz", "ref.txt", "hyp")] == ["de", "de", None,
                                                                                                  None]


@pytest.mark.parametrize("source, absent", [("demo", ["tok_bleu_compound_split", "lc_tok_bleu"]),
                                            ("wmt14", ["lc_tok_bleu"]), ("multi30k", []), ("files", []), (None, [])])
def test_only_the_metrics_that_apply_to_the_data_are_reported(source, absent):
    scores = score(HYPS, REFS, lang="de")
    marked = applicable(scores, source)
    assert {key: value for key, value in marked.items() if key != "not_applicable"} == scores  # every number kept
    assert marked.get("not_applicable", {}).get("metrics", []) == absent
    text = format_scores(marked)
    assert ("tok. BLEU, compound split" in text) == ("tok_bleu_compound_split" not in absent)
    assert ("Multi30k lit. BLEU" in text) == ("lc_tok_bleu" not in absent)
    assert ("not reported: " in text) == bool(absent)
    if absent:
        assert marked["not_applicable"]["reason"] == NOT_APPLYING[source][1] and NOT_APPLYING[source][1] in text
    assert json.loads(format_scores(marked, as_json=True)) == marked


def test_eval_bleu_on_the_demos_prepared_reference_says_why_two_metrics_are_absent(tmp_path):
    """The demo's target is a synthetic language: Moses' German rules, compound splitting and Multi30k's literature
    BLEU mean nothing there. The same files outside prepared data (the user's own) get every metric."""
    ref = _prepared(tmp_path, "demo")
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("\n".join(HYPS) + "\n", encoding="utf-8")
    result = runner.invoke(app, ["eval-bleu", "--hyp", str(hyp), "--ref", str(ref)])
    assert result.exit_code == 0, result.output
    assert "sacreBLEU" in result.stdout and "chrF" in result.stdout
    assert "Multi30k lit. BLEU" not in result.stdout and "tok. BLEU, compound split" not in result.stdout
    assert "(not reported: the demo's target is a synthetic language" in result.stdout
    # the JSON keeps every number (scripts read its keys) and names those that do not apply, with the reason
    as_json = json.loads(runner.invoke(app, ["eval-bleu", "--hyp", str(hyp), "--ref", str(ref), "--json"]).stdout)
    assert as_json["not_applicable"]["metrics"] == ["tok_bleu_compound_split", "lc_tok_bleu"]
    assert as_json["not_applicable"]["reason"].startswith("the demo's target") and "lc_tok_bleu" in as_json
    own = tmp_path / "own.de"
    own.write_text(ref.read_text(encoding="utf-8"), encoding="utf-8")
    result = runner.invoke(app, ["eval-bleu", "--hyp", str(hyp), "--ref", str(own)])
    assert "Multi30k lit. BLEU" in result.stdout and "not reported" not in result.stdout


def test_the_data_source_is_read_only_from_files_that_prepare_wrote(tmp_path):
    ref = _prepared(tmp_path, "wmt14")
    assert data_source_of(ref) == "wmt14"
    beside = ref.parent / "test.hyp"  # in the same directory, but not prepare's
    beside.write_text("x\n", encoding="utf-8")
    assert data_source_of(beside) is None and data_source_of(tmp_path / "nope.de") is None


def test_forms_that_mislead_are_said_once_each():
    tok, raw = ["ein kind fährt ski ."] * 3, ["Ein Kind fährt Ski."] * 3
    assert [line.split(":")[0] for line in form_warnings("h", "r", tok, raw)] == ["warning"]
    assert "h looks like Multi30k's" in form_warnings("h", "r", tok, raw)[0]
    assert "r looks like Multi30k's" in form_warnings("h", "r", raw, tok)[0]
    assert [line.split(":")[0] for line in form_warnings("h", "r", tok, tok)] == ["note"]
    assert form_warnings("h", "r", raw, raw) == []
    lowercase = ["ein kind fährt ski."] * 3  # a tok model's detokenized translations: plain text, but lowercase
    assert "is all lowercase and r is cased" in form_warnings("h", "r", lowercase, raw)[0]


def test_score_files_refuses_raw_text_given_as_pretokenized(tmp_path):
    hyp, ref = tmp_path / "hyp.de", tmp_path / "ref.de"
    hyp.write_text("ein kind fährt ski .\n", encoding="utf-8")
    ref.write_text("Ein Kind fährt Ski.\n", encoding="utf-8")
    said: list[str] = []
    with pytest.raises(UserError, match=r"ref\.de: --pretokenized, but 1 of 1 lines look like raw text \(line 1"):
        score_files(hyp, ref, None, True, said.append)
    scores = score_files(hyp, ref, None, False, said.append)
    assert scores["lc_tok_bleu"] == pytest.approx(100.0) and said and said[0].startswith("warning:")
