"""scripts/study_positions.py --report on a study root built by hand (no training): what it reads of each run's
long_results.json, and over how many seeds its long-input columns are."""

from __future__ import annotations

import json
from pathlib import Path

from tests.experiments.test_tables import _result

from . import load_script

SCHEMES = {"positions=absolute": "absolute sinusoidal", "base": "Shaw k=16"}


def study_root(root: Path) -> None:
    """Two schemes, two seeds each, every run finished with its long sets scored (x4 test BLEU 10 + seed)."""
    plan = {"config": "configs/x.yaml", "overrides": [], "runs": {}}
    for name, label in SCHEMES.items():
        for seed in (1, 2):
            run = f"{name}/seed{seed}"
            plan["runs"][run] = {"seed": seed, "overrides": [], "cells": [["schemes", label]]}
            (root / run).mkdir(parents=True)
            (root / run / "result.json").write_text(json.dumps(_result(run, seed, 30.0, 31.0, parameters=1000)))
            sets = {f"test.x{f}": {"bleu": 10.0 * f + seed, "length_ratio": 0.5} for f in (1, 2, 3, 4)}
            buckets = {"test": [{"bucket": "≤ 9", "low": 0, "high": 9, "sentences": 5, "bleu": 20.0 + seed}]}
            (root / run / "long_results.json").write_text(json.dumps({"sets": sets, "buckets": buckets}))
    (root / "plan.json").write_text(json.dumps(plan))


def report(root: Path) -> list[str]:
    return ["configs/multi30k_en_de_positions.yaml", "--root", str(root), "--report"]


def test_long_columns_over_fewer_seeds_than_finished_say_so(tmp_path, capsys):
    """A finished run without long_results.json (its long sets failed) was counted in the seeds column (2/2) while
    the x2-x4 columns and the bucket table averaged the other seed alone, unmarked."""
    study = load_script("scripts/study_positions.py")
    study_root(tmp_path)
    (tmp_path / "base" / "seed2" / "long_results.json").unlink()
    assert study.main(report(tmp_path)) == 0
    study_table, bucket_table = capsys.readouterr().out.split("\n\n")[:2]
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in study_table.splitlines()[2:]}
    assert rows["Shaw k=16"][1] == "2/2" and rows["Shaw k=16"][6] == "41.00 (1 of 2 seeds)"
    assert rows["absolute sinusoidal"][6].startswith("41.50 ± ") and "seeds)" not in rows["absolute sinusoidal"][6]
    assert bucket_table.splitlines()[2:] == ["| absolute sinusoidal | 21.50 |", "| Shaw k=16 (1 of 2 seeds) | 21.00 |"]


def test_an_unreadable_long_results_json_is_a_one_line_error(tmp_path, capsys):
    study = load_script("scripts/study_positions.py")
    study_root(tmp_path)
    path = tmp_path / "base" / "seed1" / "long_results.json"
    path.write_text(path.read_text()[:40])  # cut short
    assert study.main(report(tmp_path)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}: not readable JSON" in err


def test_a_plot_under_a_file_is_refused_before_the_tables(tmp_path, capsys):
    """--plot is drawn after the tables are printed: a path under a file was a FileExistsError traceback then."""
    study = load_script("scripts/study_positions.py")
    study_root(tmp_path / "study")
    (tmp_path / "notes.txt").write_text("a file")
    plot = tmp_path / "notes.txt" / "bleu.png"
    assert study.main(report(tmp_path / "study") + ["--plot", str(plot)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert f"--plot {plot}: its directory {tmp_path / 'notes.txt'} is a file" in captured.err


def test_a_directory_without_a_plan_names_the_study_script(tmp_path, capsys):
    """It named scripts/sweep.py, which makes the paper's tables, not a study root."""
    study = load_script("scripts/study_positions.py")
    assert study.main(report(tmp_path)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is " + str(tmp_path) + " a results root made by scripts/study_positions.py?" in err
