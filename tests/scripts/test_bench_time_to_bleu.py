"""scripts/bench_time_to_bleu.py on a tiny model and the demo corpus: a budgeted run, the dev-chosen decoding, and
the dev-only mode that never decodes test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu

from rpr_mt.config import config_from_dict, save_config
from rpr_mt.data.prepare import reference_files
from tests.train.test_trainer import tiny

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def budget_config(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("budget")
    raw = tiny(root / "data", root / "run", train={"max_steps": None, "max_time": 6, "lr_schedule": "budget",
                                                     "warmup_fraction": 0.1, "average_last": 2})
    path = root / "budget.yaml"
    save_config(config_from_dict(raw), path)
    return path


def _run(config: Path, *extra: str) -> tuple[str, dict]:
    json_path = config.parent / "rows.json"
    done = subprocess.run(
        [sys.executable, "scripts/bench_time_to_bleu.py", str(config), "--length-penalties", "0.6", "1.0",
         "--json", str(json_path), *extra], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, json.loads(json_path.read_text())[0]


def _refs(config: Path, split: str) -> list[str]:
    _, ref_path = reference_files(config.parent / "data", split)
    return ref_path.read_text(encoding="utf-8").splitlines()


def test_dev_only_never_decodes_test(budget_config):
    stdout, row = _run(budget_config, "--dev-only")
    run_dir = budget_config.parent / "run"
    assert (run_dir / "dev.hyp").is_file() and not (run_dir / "test.hyp").exists()
    assert "test_bleu" not in row and row["dev_bleu"] == max(c["dev_bleu"] for c in row["dev_grid"])
    assert len(row["dev_grid"]) == 4  # {last, average} x {0.6, 1.0}
    table_row = next(line for line in stdout.splitlines() if line.startswith("| budget.yaml"))
    assert table_row.endswith("| – | – | – |")


def test_full_run_scores_test_once_with_the_dev_choice(budget_config):
    stdout, row = _run(budget_config)
    assert row["train_seconds"] <= 6 + 5  # the budget, plus at most one update and the final save
    run_dir = budget_config.parent / "run"
    hyps = (run_dir / "test.hyp").read_text(encoding="utf-8").splitlines()
    assert row["test_bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [_refs(budget_config, "test")]).score)
    assert f"| {row['test_bleu']:.1f} |" in stdout and row["signature"].startswith("nrefs:1")
