"""The sweep on tiny demo-corpus runs: planning, skipping finished runs, resuming interrupted ones, results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rpr_mt.config import config_from_dict, load_config, save_config
from rpr_mt.data.prepare import prepare, reference_files
from rpr_mt.decode.translate import read_lines
from rpr_mt.errors import UserError
from rpr_mt.evaluate import score
from rpr_mt.experiments.lengths import length_table, render_length_table
from rpr_mt.experiments.sweep import plan_runs, run_config, run_sweep
from rpr_mt.experiments.tables import load_sweep
from rpr_mt.provenance import code_version
from rpr_mt.train import checkpoint as ckpt
from rpr_mt.train.trainer import train
from tests.train.test_trainer import tiny

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def base_config(tmp_path_factory) -> Path:
    """A tiny relative model (k = 4) on a tiny demo corpus; decodes 20 dev and 20 test sentences."""
    root = tmp_path_factory.mktemp("sweep")
    raw = tiny(root / "data", root / "unused", train={"validate_every": 100, "save_every": 4})
    path = root / "base.yaml"
    save_config(config_from_dict(raw), path)
    prepare(load_config(path).data, progress=False)
    return path


def test_plan_shares_runs_between_tables_and_names_them_by_their_overrides(base_config):
    runs = plan_runs(base_config, ["positions", "clip", "key_value"], [1, 2], [])
    names = sorted({run.name for run in runs})
    # base (relative, k = 4, aK + aV) stands for Table 1's relative row, Table 2's k = 4 and Table 3's aV + aK.
    assert names == sorted(["base", "positions=absolute", "clip=0", "clip=1", "clip=2", "clip=16", "clip=64",
                            "clip=256", "use_value=false", "use_key=false", "positions=none"])
    assert len(runs) == 2 * len(names)
    base = next(run for run in runs if run.name == "base" and run.seed == 1)
    assert base.overrides == []
    assert sorted(base.cells) == [("clip", "k=4"), ("key_value", "aV+aK"), ("positions", "relative")]
    cfg = run_config(base_config, [], next(r for r in runs if r.name == "use_key=false" and r.seed == 2), "R")
    assert (cfg.model.use_key, cfg.model.use_value, cfg.train.seed) == (False, True, 2)
    assert cfg.train.run_dir == str(Path("R") / "use_key=false" / "seed2")


def test_unknown_table_and_run_are_clear_errors(base_config, tmp_path):
    with pytest.raises(UserError, match="unknown table"):
        plan_runs(base_config, ["table4"], [1], [])
    with pytest.raises(UserError, match="not a run of this sweep"):
        run_sweep(base_config, tmp_path, ["positions"], [1], only=["clip=0/seed1"], log=lambda _: None)


def test_sweep_runs_skips_finished_and_resumes_interrupted_runs(base_config, tmp_path, capsys):
    root = tmp_path / "sweep"
    runs = plan_runs(base_config, ["positions"], [1], [])
    assert [run.directory for run in runs] == ["positions=absolute/seed1", "base/seed1"]

    # Interrupt the base run by hand: train it for 6 of its 12 updates (checkpoints at 4 and 6).
    base_run = runs[1]
    cfg = run_config(base_config, [], base_run, root)
    partial = config_from_dict({**_raw(cfg), "train": {**_raw(cfg)["train"], "max_steps": 6}})
    first_half = train(partial, progress=False)
    assert [p.name for p in ckpt.list_step_checkpoints(cfg.train.run_dir)][-1] == "checkpoint_00000006.pt"

    messages: list[str] = []
    assert run_sweep(base_config, root, ["positions"], [1], log=messages.append) == "done"
    assert f"resuming from {Path(cfg.train.run_dir) / 'checkpoints' / 'checkpoint_00000006.pt'}" in capsys.readouterr().err
    results = {run.directory: json.loads((root / run.directory / "result.json").read_text()) for run in runs}
    for directory, result in results.items():
        assert result["updates"] == 12
        # The recorded BLEU is the BLEU of the hypotheses it wrote.
        for split in ("dev", "test"):
            _, ref_path = reference_files(cfg.data.output_dir, split)
            hyps = read_lines(root / directory / f"{split}.hyp")
            assert score(hyps, read_lines(ref_path), lang="xx")["sacrebleu"] == pytest.approx(result[f"{split}_bleu"])
    assert results["base/seed1"]["model"]["positions"] == "relative"
    # The code of every sweep invocation is recorded (the hand-run first half above was not a sweep invocation).
    assert results["base/seed1"]["code"] == [code_version()]
    assert results["positions=absolute/seed1"]["model"]["positions"] == "absolute"
    # Training totals count the first half too, though it left no line in invocations.jsonl (as a killed run would
    # not): both runs trained on the same batches (same data and seed), so the same number of target tokens.
    base_result, absolute_result = results["base/seed1"], results["positions=absolute/seed1"]
    assert len((root / "base/seed1" / "invocations.jsonl").read_text().splitlines()) == 1
    assert base_result["train_seconds"] > first_half.seconds
    assert (base_result["tgt_tok_s"] * base_result["train_seconds"]
            == pytest.approx(absolute_result["tgt_tok_s"] * absolute_result["train_seconds"]))
    plan = json.loads((root / "plan.json").read_text())
    assert plan["runs"]["base/seed1"]["cells"] == [["positions", "relative"]]

    # Finished runs are skipped: nothing is retrained or rewritten.
    stamps = {d: (root / d / "result.json").stat().st_mtime_ns for d in results}
    messages.clear()
    assert run_sweep(base_config, root, ["positions"], [1], log=messages.append) == "done"
    assert sum("finished, skipped" in m for m in messages) == 2
    assert stamps == {d: (root / d / "result.json").stat().st_mtime_ns for d in results}

    # Killed after training but before its result: only decoded again, from the same checkpoint.
    (root / "base/seed1" / "result.json").unlink()
    run_sweep(base_config, root, ["positions"], [1], log=messages.append)
    again = json.loads((root / "base/seed1" / "result.json").read_text())
    assert again["updates"] == 12 and again["dev_bleu"] == pytest.approx(results["base/seed1"]["dev_bleu"])

    # A different base config must not reuse this root.
    with pytest.raises(UserError, match="another --root"):
        run_sweep(base_config, root, ["positions"], [1], overrides=["train.max_steps=8"], log=messages.append)

    # BLEU by source length, read back from the runs: a single bucket holding every sentence is each run's own BLEU.
    table = render_length_table(length_table(load_sweep(root), "dev", edges=[]))
    assert f"| absolute | 1 | {results['positions=absolute/seed1']['dev_bleu']:.2f} |" in table
    assert f"| relative | 1 | {results['base/seed1']['dev_bleu']:.2f} |" in table


def test_list_prints_one_command_per_run(base_config, tmp_path):
    done = subprocess.run(
        [sys.executable, "scripts/sweep.py", str(base_config), "--root", str(tmp_path), "--tables", "key_value",
         "--seeds", "3", "--list"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    commands = [line for line in done.stdout.splitlines() if not line.startswith("#")]
    assert len(commands) == 4 and all("--only" in c for c in commands)
    assert "# use_key=false/seed3: to do (key_value aV only)" in done.stdout


def _raw(cfg) -> dict:
    from rpr_mt.config import config_to_dict

    return config_to_dict(cfg)
