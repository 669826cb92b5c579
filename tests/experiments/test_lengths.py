"""BLEU by source length: bucket edges, per-bucket scores of known strings, the sweep table and the aggregator."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sacrebleu.metrics import BLEU

from rpr_mt.errors import UserError
from rpr_mt.experiments.lengths import (Bucket, bleu_by_length, buckets_from_edges, length_table, plot_length_table,
                                        quartile_edges, render_length_table)
from rpr_mt.experiments.tables import load_sweep, mean_std
from tests.experiments.test_tables import _result

REPO = Path(__file__).resolve().parents[2]


def test_edges_start_new_buckets():
    buckets = buckets_from_edges([10, 13, 16])
    assert buckets == [Bucket(0, 9), Bucket(10, 12), Bucket(13, 15), Bucket(16, None)]
    assert [b.label for b in buckets] == ["≤ 9", "10–12", "13–15", "≥ 16"]
    assert buckets_from_edges([2, 3]) == [Bucket(0, 1), Bucket(2, 2), Bucket(3, None)] and Bucket(2, 2).label == "2"
    assert buckets_from_edges([]) == [Bucket(0, None)] and buckets[0].contains(0)  # an empty source still counts
    for bad in ([13, 10], [10, 10], [1]):
        with pytest.raises(UserError, match="increasing integers"):
            buckets_from_edges(bad)


def test_quartile_edges_fill_buckets_evenly():
    lengths = list(range(1, 21))  # 5 sentences per quartile
    buckets = buckets_from_edges(quartile_edges(lengths))
    assert [sum(b.contains(n) for n in lengths) for b in buckets] == [5, 5, 5, 5]
    assert quartile_edges([7] * 10) == []  # one length: one bucket
    with pytest.raises(UserError, match="at least 2"):
        quartile_edges([3])


def test_bleu_by_length_scores_each_bucket_as_its_own_corpus():
    short = ["a dog runs on the grass", "two men play football in a park"]  # 6-7 words
    long = ["a woman in a red coat walks past a shop window on a busy street"]  # 15 words
    sources = [short[0], long[0], short[1]]
    references = ["ein hund rennt auf dem gras", "eine frau in einem roten mantel geht an einem schaufenster vorbei",
                  "zwei männer spielen fußball in einem park"]
    hypotheses = [references[0], "völlig andere wörter ohne jede gemeinsamkeit hier", references[2]]
    scores = bleu_by_length(sources, hypotheses, references, buckets_from_edges([10, 20]))
    assert scores[0] == (2, pytest.approx(100.0))
    assert scores[1] == (1, pytest.approx(0.0))
    assert scores[2] == (0, None)
    # One bucket for all sentences is the corpus BLEU of the whole split.
    whole = BLEU().corpus_score(hypotheses, [references]).score
    assert bleu_by_length(sources, hypotheses, references, buckets_from_edges([])) == [(3, pytest.approx(whole))]
    with pytest.raises(UserError, match="line-aligned"):
        bleu_by_length(sources, hypotheses[:2], references, buckets_from_edges([]))


def sweep_with_hypotheses(root: Path, data_dir: Path) -> dict[str, list[str]]:
    """Two seeds of 'relative' (= k=16) and one of 'absolute', each with a dev.hyp; sources of 4 and 12 words."""
    data_dir.mkdir()
    (data_dir / "manifest.json").write_text(json.dumps({"src_lang": "en", "tgt_lang": "de", "splits": ["dev"]}))
    sources = ["one two three four", "a b c d e f g h i j k l", "five six seven eight", "m n o p q r s t u v w x"]
    references = ["eins zwei drei vier", "das ist ein langer satz mit zwölf wörtern für den test hier",
                  "fünf sechs sieben acht",
                  "noch ein langer satz mit zwölf wörtern damit der eimer voll ist"]
    (data_dir / "dev.en").write_text("\n".join(sources) + "\n")
    (data_dir / "dev.de").write_text("\n".join(references) + "\n")
    hypotheses = {
        "base/seed1": references,
        "base/seed2": [references[0], "ganz falsch", references[2], references[3]],
        "positions=absolute/seed1": [references[0], "ganz falsch", references[2], "auch falsch"],
    }
    cells = {"base": [["positions", "relative"], ["clip", "k=16"]], "positions=absolute": [["positions", "absolute"]]}
    plan = {"config": "configs/x.yaml", "overrides": [], "runs": {}}
    for run, hyps in hypotheses.items():
        overrides = [] if run.startswith("base/") else ["model.positions=absolute"]
        plan["runs"][run] = {"seed": int(run[-1]), "overrides": overrides, "cells": cells[run.split("/")[0]]}
        (root / run).mkdir(parents=True)
        (root / run / "dev.hyp").write_text("\n".join(hyps) + "\n")
        (root / run / "result.json").write_text(json.dumps(_result(run, int(run[-1]), 0.0, 0.0)))
    plan["runs"]["clip=0/seed1"] = {"seed": 1, "overrides": ["model.clip=0"], "cells": [["clip", "k=0"]]}  # unfinished
    (root / "plan.json").write_text(json.dumps(plan))
    return {"sources": sources, "references": references, **hypotheses}


def test_length_table_averages_bucket_bleu_over_seeds(tmp_path):
    data = sweep_with_hypotheses(tmp_path / "sweep", tmp_path / "data")
    table = render_length_table(length_table(load_sweep(tmp_path / "sweep"), "dev", [5], data_dir=tmp_path / "data"))
    buckets = buckets_from_edges([5])

    def bucket_bleu(run: str) -> list[float]:
        return [s for _, s in bleu_by_length(data["sources"], data[run], data["references"], buckets)]

    seed1, seed2 = bucket_bleu("base/seed1"), bucket_bleu("base/seed2")
    assert seed1[0] == pytest.approx(100.0) and seed2[1] < seed1[1]  # the long bucket differs between seeds
    lines = table.splitlines()
    assert lines[0] == "| cell | seeds | ≤ 4 words (2) | ≥ 5 words (2) |"
    # Cells backed by the same runs are one row; unfinished cells have no row.
    assert f"| absolute | 1 | {mean_std([bucket_bleu('positions=absolute/seed1')[0]])} | 0.00 |" in lines
    relative = [line for line in lines if line.startswith("| relative = k=16 |")]
    assert relative == [f"| relative = k=16 | 2 | {mean_std([seed1[0], seed2[0]])} | {mean_std([seed1[1], seed2[1]])} |"]
    assert not any("k=0" in line.split(" | ")[0] for line in lines)


def test_length_table_errors_name_the_file(tmp_path):
    sweep_with_hypotheses(tmp_path / "sweep", tmp_path / "data")
    sweep = load_sweep(tmp_path / "sweep")
    with pytest.raises(UserError, match=r"base/seed1/config\.yaml not found: pass --data-dir"):
        length_table(sweep, "dev")
    (tmp_path / "sweep" / "base/seed2" / "dev.hyp").write_text("too short\n")
    with pytest.raises(UserError, match=r"seed2/dev\.hyp has 1 lines, .*dev\.en has 4"):
        length_table(sweep, "dev", data_dir=tmp_path / "data")
    (tmp_path / "sweep" / "base/seed2" / "dev.hyp").unlink()
    with pytest.raises(UserError, match=r"seed2/dev\.hyp not found"):
        length_table(sweep, "dev", data_dir=tmp_path / "data")


def test_aggregate_by_length_cli(tmp_path):
    sweep_with_hypotheses(tmp_path / "sweep", tmp_path / "data")
    args = [sys.executable, "scripts/aggregate.py", str(tmp_path / "sweep"), "--by-length", "dev",
            "--data-dir", str(tmp_path / "data")]
    done = subprocess.run(args + ["--length-edges", "5"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "## BLEU by source length (dev)" in done.stdout
    assert "| cell | seeds | ≤ 4 words (2) | ≥ 5 words (2) |" in done.stdout
    bad = subprocess.run(args + ["--length-edges", "5,x"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "comma-separated integers" in bad.stderr and "Traceback" not in bad.stderr


def test_length_plot_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    sweep_with_hypotheses(tmp_path / "sweep", tmp_path / "data")
    table = length_table(load_sweep(tmp_path / "sweep"), "dev", [5], data_dir=tmp_path / "data")
    path = plot_length_table(table, tmp_path / "img", prefix="m30k_")
    assert path == tmp_path / "img" / "m30k_bleu_by_length.png" and path.read_bytes().startswith(b"\x89PNG")


def test_bucket_bleu_of_pretokenized_text_is_the_literatures_not_sacrebleus():
    """Runs on Multi30k's tokenized text: the text is scored as it is (sacreBLEU's 13a would split it again, warn
    'forgot to detokenize' and give another number)."""
    sources = ["a man &apos;s dog .", "two kids play ."]
    references = ["the man &apos;s dog runs .", "two kids play ."]
    hypotheses = ["the man &apos;s cat runs .", "two kids play ."]
    tokenized = bleu_by_length(sources, hypotheses, references, buckets_from_edges([]), pretokenized=True)
    expected = BLEU(tokenize="none", smooth_method="none", force=True).corpus_score(hypotheses, [references]).score
    assert tokenized == [(2, pytest.approx(expected))]
    assert expected != pytest.approx(BLEU().corpus_score(hypotheses, [references]).score)
