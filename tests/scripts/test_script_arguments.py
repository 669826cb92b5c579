"""The experiment scripts refuse what they cannot do before doing anything: flags that another flag needs, outputs
that would replace their inputs, unknown runs (each a one-line error, exit 2, no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from . import REPO, load_script


def test_study_report_flags_without_report_start_nothing(tmp_path, capsys):
    study = load_script("scripts/study_positions.py")
    for flags in (["--plot", "x.png"], ["--bootstrap"], ["--lengths"], ["--baseline", "t5"]):
        with pytest.raises(SystemExit) as stop:
            study.main(["configs/demo.yaml", "--root", str(tmp_path / "study"), *flags])
        assert stop.value.code == 2 and "go(es) with --report" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        study.main(["configs/demo.yaml", "--root", str(tmp_path / "study"), "--report", "--plot", "x.txt"])
    assert "give a .png, .pdf or .svg file" in capsys.readouterr().err
    assert not (tmp_path / "study").exists()


def make_sweep_root(root):
    run = root / "base" / "seed1"
    run.mkdir(parents=True)
    (root / "plan.json").write_text(json.dumps({"config": "c.yaml", "runs": {}}))
    (run / "result.json").write_text("{}")
    return run


@pytest.mark.parametrize("out, fragment", [("plan.json", "would replace a file of the sweep"),
                                           ("base/seed1/result.json", "would replace a file of the sweep"),
                                           (".", "is a directory"), ("nodir/x.md", "does not exist")])
def test_aggregate_refuses_an_output_that_would_replace_its_input_or_cannot_be_written(tmp_path, capsys, out,
                                                                                         fragment):
    aggregate = load_script("scripts/aggregate.py")
    make_sweep_root(tmp_path)
    plan = (tmp_path / "plan.json").read_text()
    assert aggregate.main([str(tmp_path), "--out", str(tmp_path / out)]) == 2
    assert fragment in capsys.readouterr().err
    assert (tmp_path / "plan.json").read_text() == plan


def test_aggregate_names_an_unreadable_plan(tmp_path, capsys):
    aggregate = load_script("scripts/aggregate.py")
    make_sweep_root(tmp_path)
    (tmp_path / "plan.json").write_text("# a markdown table\n")
    assert aggregate.main([str(tmp_path)]) == 2
    assert "plan.json: not readable JSON" in capsys.readouterr().err


def test_sweep_list_takes_only_and_plans_a_repeated_seed_or_table_once(tmp_path):
    def sweep(*args):
        return subprocess.run([sys.executable, "scripts/sweep.py", "configs/demo.yaml", "--root", str(tmp_path / "r"),
                               "--tables", "positions", *args], cwd=REPO, capture_output=True, text=True, timeout=120)

    listed = sweep("--seeds", "1", "2", "--list", "--only", "base/seed2")
    assert listed.returncode == 0, listed.stderr
    assert [line for line in listed.stdout.splitlines() if line.startswith("#")] == [
        "# base/seed2: to do (positions relative)"]
    completed = sweep("--seeds", "1", "2", "--list", "--only", "base/seed2/")  # as a shell completes a directory
    assert completed.returncode == 0 and completed.stdout == listed.stdout, completed.stderr
    unknown = sweep("--seeds", "1", "--list", "--only", "base/seed9")
    assert unknown.returncode == 2 and "no such run" in unknown.stderr and "Traceback" not in unknown.stderr
    # a seed given twice (repeated flags accumulate: --seeds 1 2 --seeds 2 3) is planned once, in its first place
    twice = sweep("--seeds", "2", "1", "--seeds", "1", "--list")
    assert twice.returncode == 0, twice.stderr
    assert [line[2:].split(":")[0] for line in twice.stdout.splitlines() if line.startswith("#")] == [
        "positions=absolute/seed2", "base/seed2", "positions=absolute/seed1", "base/seed1"]
    assert all("--seeds 2 1 --only" in line for line in twice.stdout.splitlines() if not line.startswith("#"))
    # --tables and --seeds given again add to the first, as --set and --only do (the last one alone counted)
    repeated = sweep("--tables", "clip", "positions", "--seeds", "1", "--seeds", "2", "--list")
    assert repeated.returncode == 0, repeated.stderr
    names = [line[2:].split(":")[0] for line in repeated.stdout.splitlines() if line.startswith("#")]
    assert {"base/seed2", "clip=0/seed1", "positions=absolute/seed2"} <= set(names) and len(names) == len(set(names))
    assert "(positions relative, positions relative" not in repeated.stdout  # a table named twice is planned once
    assert not (tmp_path / "r").exists()


def test_time_to_bleu_checks_every_config_before_it_deletes_or_trains(tmp_path, capsys):
    bench = load_script("scripts/bench_time_to_bleu.py")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "keep.txt").write_text("a previous run")
    overrides = ["--set", f"train.run_dir={run_dir}"]
    assert bench.main(["configs/demo.yaml", str(tmp_path / "missing.yaml"), *overrides]) == 2
    assert "config file not found" in capsys.readouterr().err
    assert bench.main(["configs/demo.yaml", "--set", "foo.bar=1", *overrides]) == 2
    assert "unknown key 'foo'" in capsys.readouterr().err
    assert (run_dir / "keep.txt").is_file()  # the first config's run was not started (it deletes its run_dir)


def test_study_report_on_a_root_without_study_runs_says_so(tmp_path, capsys):
    study = load_script("scripts/study_positions.py")
    make_sweep_root(tmp_path)
    assert study.main(["configs/demo.yaml", "--root", str(tmp_path), "--report"]) == 2
    assert "holds no position-study runs" in capsys.readouterr().err


def test_sweep_list_refuses_a_base_config_changed_since_its_plan(tmp_path):
    """--list called a finished run 'to do' after the base config was edited: it now says what changed."""
    from rpr_mt.experiments.sweep import _base_settings

    root = tmp_path / "r"
    root.mkdir()
    settings = _base_settings(REPO / "configs" / "demo.yaml", [])
    settings["train"]["peak_lr"] = 0.5
    (root / "plan.json").write_text(json.dumps({"runs": {}, "base_settings": settings}))
    listed = subprocess.run([sys.executable, "scripts/sweep.py", "configs/demo.yaml", "--root", str(root), "--tables",
                             "positions", "--seeds", "1", "--list"], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert listed.returncode == 2 and "train.peak_lr: 0.5 -> 0.003" in listed.stderr, listed.stderr


def test_study_seeds_given_again_add_to_the_first(tmp_path, monkeypatch):
    """study_positions.py kept the last --seeds alone (sweep.py's accumulate); a seed given twice is trained once."""
    import rpr_mt.experiments.sweep as sweep_module

    study = load_script("scripts/study_positions.py")
    asked = []
    monkeypatch.setattr(sweep_module, "run_sweep", lambda config, root, tables, seeds, *rest, **kw: asked.append(seeds)
                        or "done")
    assert study.main(["configs/demo.yaml", "--root", str(tmp_path / "s"), "--seeds", "3", "1", "--seeds", "1", "2"]) == 0
    assert study.main(["configs/demo.yaml", "--root", str(tmp_path / "s")]) == 0
    assert asked == [[3, 1, 2], [1, 2]]


def test_sweep_list_names_a_plan_that_is_json_but_not_a_plan(tmp_path):
    """A plan.json of another shape ([] or another tool's object) was an AttributeError traceback."""
    root = tmp_path / "r"
    root.mkdir()
    (root / "plan.json").write_text("[]")
    listed = subprocess.run([sys.executable, "scripts/sweep.py", "configs/demo.yaml", "--root", str(root), "--tables",
                             "positions", "--seeds", "1", "--list"], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert listed.returncode == 2 and listed.stderr.count("\n") == 1, listed.stderr
    assert f"{root / 'plan.json'} is not a sweep plan (no 'runs' mapping)" in listed.stderr


@pytest.mark.parametrize("under, fragment", [("", "is a file; give a directory"),
                                             ("/r", "cannot create the directory (")])
def test_sweep_list_refuses_a_root_that_cannot_be_one(tmp_path, under, fragment):
    """--list printed one command per run for a --root that is a file (or under one): every command then failed."""
    file = tmp_path / "notes.txt"
    file.write_text("not a sweep")
    listed = subprocess.run([sys.executable, "scripts/sweep.py", "configs/demo.yaml", "--root", f"{file}{under}",
                             "--tables", "positions", "--seeds", "1", "--list"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert listed.returncode == 2 and listed.stdout == "" and listed.stderr.count("\n") == 1, listed.stderr
    assert fragment in listed.stderr and "Traceback" not in listed.stderr


def test_aggregate_refuses_a_plots_directory_under_a_file_before_writing_the_report(tmp_path, capsys):
    """--plots under a file was a NotADirectoryError traceback, after --out had been written."""
    aggregate = load_script("scripts/aggregate.py")
    make_sweep_root(tmp_path / "sweep")
    (tmp_path / "notes.txt").write_text("a file")
    out = tmp_path / "report.md"
    plots = tmp_path / "notes.txt" / "img"
    assert aggregate.main([str(tmp_path / "sweep"), "--out", str(out), "--plots", str(plots)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot create the directory" in err and "is a file" in err
    assert not out.exists()


# A run_sweep that is sent SIGTERM while it works, as `timeout` or a scheduler sends it while a trained run decodes
# (training has its own handler): the script must say so in one line and exit 143, where the signal's default ended
# it silently. In a child process: without the handler the signal would end the test process.
_TERMINATED_SWEEP = """
import os, signal, sys, time
sys.path.insert(0, {repo!r})
from tests.scripts import load_script
script = load_script({script!r})
def run_sweep(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)
    return "done"
import rpr_mt.experiments.sweep
script.run_sweep = rpr_mt.experiments.sweep.run_sweep = run_sweep  # imported at the top of sweep.py, in study's main
sys.exit(script.main(["configs/demo.yaml", "--root", {root!r}]))
"""


@pytest.mark.parametrize("script, what", [("scripts/sweep.py", "sweep"), ("scripts/study_positions.py", "study")])
def test_sigterm_while_a_sweep_decodes_is_one_line_and_exit_143(tmp_path, script, what):
    code = _TERMINATED_SWEEP.format(repo=str(REPO), script=script, root=str(tmp_path / "root"))
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 143, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.strip().splitlines() == [
        f"stopped by SIGTERM; the same command resumes the {what} (a run's decoding starts again)"]


@pytest.mark.parametrize("script", ["scripts/sweep.py", "scripts/study_positions.py"])
@pytest.mark.parametrize("received, status", [("SIGTERM", 143), ("SIGHUP", 129), ("SIGINT", 130)])
def test_a_sweep_whose_run_a_signal_stopped_exits_with_that_signal(tmp_path, monkeypatch, script, received, status):
    """A run's training stopped by a scheduler's SIGTERM (the trainer saves and returns) exited 130, as Ctrl-C does;
    `rpr-mt train` exits 143 there, and so do the scripts now: 128 + the signal's number."""
    import rpr_mt.experiments.sweep

    module = load_script(script)
    stopped = lambda *args, **kwargs: received  # noqa: E731  (run_sweep's return when a signal stopped a run)
    monkeypatch.setattr(rpr_mt.experiments.sweep, "run_sweep", stopped)
    monkeypatch.setattr(module, "run_sweep", stopped, raising=False)
    assert module.main(["configs/demo.yaml", "--root", str(tmp_path / "root")]) == status
