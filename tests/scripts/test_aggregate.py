"""scripts/aggregate.py: a report whose optional sections cannot be computed yet is still written, tables and plots."""

from __future__ import annotations

import pytest

from tests.experiments.test_lengths import sweep_with_hypotheses

from . import load_script


def test_paired_bootstrap_without_a_base_run_still_writes_the_tables_and_plots(tmp_path, capsys):
    """The base run not finished (or not planned at all: --tables clip with a base k that is none of the paper's, a
    schemes sweep) aborted the whole report with exit 2, after --by-length had written its plot."""
    pytest.importorskip("matplotlib")
    aggregate = load_script("scripts/aggregate.py")
    sweep_with_hypotheses(tmp_path / "sweep", tmp_path / "data")
    for seed in (1, 2):
        (tmp_path / "sweep" / "base" / f"seed{seed}" / "result.json").unlink()
    common = [str(tmp_path / "sweep"), "--data-dir", str(tmp_path / "data"), "--paired-bootstrap", "dev"]
    out, plots = tmp_path / "report.md", tmp_path / "img"
    assert aggregate.main([*common, "--by-length", "dev", "--out", str(out), "--plots", str(plots)]) == 0
    report = out.read_text(encoding="utf-8")
    assert "## Table 1: absolute vs relative position representations" in report
    assert "## BLEU by source length (dev)" in report
    assert ("Not computed: the base run (the config without overrides) has not finished yet (base/seed1, "
            "base/seed2).") in report
    assert (plots / "bleu_by_length.png").is_file()
    # --baseline: the comparison is another cell's runs; one the sweep lacks is refused before anything is written
    assert aggregate.main([*common, "--baseline", "absolute"]) == 0
    assert "## Paired bootstrap against the absolute run (dev)" in capsys.readouterr().out
    (plots / "bleu_by_length.png").unlink()
    assert aggregate.main([*common, "--by-length", "dev", "--plots", str(plots), "--baseline", "k=3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--baseline 'k=3' is not a cell of the sweep" in err
    assert list(plots.iterdir()) == []
    with pytest.raises(SystemExit):
        aggregate.main([str(tmp_path / "sweep"), "--baseline", "absolute"])
    assert "--baseline chooses the comparison of --paired-bootstrap" in capsys.readouterr().err
    # --prefix without --plots and --data-dir without a section that reads references were ignored without a word
    for alone, said in ((["--prefix", "x_"], "--prefix names the files of --plots"),
                        (["--data-dir", str(tmp_path)], "--data-dir is where --paired-bootstrap and --by-length")):
        with pytest.raises(SystemExit):
            aggregate.main([str(tmp_path / "sweep"), *alone])
        assert said in capsys.readouterr().err


def test_a_sweep_with_nothing_finished_is_reported_with_its_sections_not_computed(tmp_path, capsys):
    aggregate = load_script("scripts/aggregate.py")
    sweep_with_hypotheses(tmp_path / "sweep", tmp_path / "data")
    for result in (tmp_path / "sweep").glob("*/*/result.json"):
        result.unlink()
    assert aggregate.main([str(tmp_path / "sweep"), "--by-length", "dev", "--paired-bootstrap", "test"]) == 0
    report = capsys.readouterr().out
    assert "0 of 4 runs finished" in report
    assert "## BLEU by source length (dev)\n\nNot computed: no run has finished yet." in report
    assert "Not computed: the base run (the config without overrides) has not finished yet" in report


def test_paired_bootstrap_section_says_the_verdict_on_each_paper_claim(tmp_path, capsys):
    """The verdicts of docs/results.md ("holds", "within noise") were written by hand: the report says them, with
    the paper's claim each row tests and the rule under the table."""
    aggregate = load_script("scripts/aggregate.py")
    sweep_with_hypotheses(tmp_path / "sweep", tmp_path / "data")
    assert aggregate.main([str(tmp_path / "sweep"), "--data-dir", str(tmp_path / "data"), "--paired-bootstrap",
                           "dev"]) == 0
    section = capsys.readouterr().out.split("## Paired bootstrap against the base run (dev)")[1]
    assert "| paper (En-De) | verdict |\n|---|---|---|---|---|---|\n" in section
    absolute = next(line for line in section.splitlines() if line.startswith("| absolute |"))
    assert absolute.split(" | ")[-2:] in (["below base (-0.3)", "holds (1 seed) |"],
                                          ["below base (-0.3)", "within noise (1 seed) |"])
    assert "a level claim holds when no seed is significant" in section


@pytest.mark.parametrize("content, fragment", [("[1, 2]", "not a run's result (a JSON object)"),
                                               ("{}", "no 'dev_bleu'"),
                                               (None, "'test_bleu' is None, not a number")])
def test_a_result_json_that_is_not_a_runs_result_is_a_one_line_error(tmp_path, capsys, content, fragment):
    """Valid JSON that is not a finished run's result (hand-edited, another tool's) gave a KeyError or TypeError
    traceback from the middle of the report."""
    import json

    aggregate = load_script("scripts/aggregate.py")
    sweep_with_hypotheses(tmp_path / "sweep", tmp_path / "data")
    path = tmp_path / "sweep" / "base" / "seed2" / "result.json"
    if content is None:
        content = json.dumps({**json.loads(path.read_text()), "test_bleu": None})
    path.write_text(content)
    assert aggregate.main([str(tmp_path / "sweep")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert f"{path}: " in captured.err and fragment in captured.err


def _with_run_configs(root, change: dict[str, list[str]] | None = None, stale: bool = False) -> None:
    """A config.yaml in every finished run of ``sweep_with_hypotheses`` as the sweep writes it (demo config, the run's
    overrides and seed) and its result's fingerprint to match; ``change``: run -> further overrides of its own (its
    result made with them, or with ``stale`` before them)."""
    import json

    from rpr_mt.config import load_config, save_config
    from rpr_mt.experiments.sweep import config_fingerprint

    from . import REPO

    plan = json.loads((root / "plan.json").read_text())
    for result_path in root.glob("*/seed*/result.json"):
        run = str(result_path.parent.relative_to(root))
        entry = plan["runs"][run]
        overrides = [*entry["overrides"], f"train.seed={entry['seed']}", f"train.run_dir={result_path.parent}"]
        cfg = load_config(REPO / "configs" / "demo.yaml", [*overrides, *(change or {}).get(run, [])])
        recorded = load_config(REPO / "configs" / "demo.yaml", overrides) if stale else cfg
        result = {**json.loads(result_path.read_text()), "fingerprint": config_fingerprint(recorded)}
        result_path.write_text(json.dumps(result))
        save_config(cfg, result_path.parent / "config.yaml")


@pytest.mark.parametrize("change, stale, fragment", [
    ({"base/seed2": ["train.peak_lr=0.5"]}, False, "base/seed1 and {root}/base/seed2 were trained with different "
                                                   "train.peak_lr (0.003 vs 0.5)"),
    ({"positions=absolute/seed1": ["train.label_smoothing=0.3"]}, False, "were trained with different "
                                                                         "train.label_smoothing (0.1 vs 0.3)"),
    ({"base/seed1": ["model.dropout=0.25"]}, True, "base/seed1/result.json was written for other settings than"),
])
def test_runs_trained_with_other_settings_are_refused_not_averaged(tmp_path, capsys, change, stale, fragment):
    """A run copied in from another sweep, or a config edited between seeds, was averaged with the others (mean ±
    std over unlike runs); a run started again with other settings showed its old result as finished."""
    aggregate = load_script("scripts/aggregate.py")
    sweep_with_hypotheses(tmp_path / "sweep", tmp_path / "data")
    _with_run_configs(tmp_path / "sweep")
    assert aggregate.main([str(tmp_path / "sweep")]) == 0  # alike runs: the report as always
    capsys.readouterr()
    _with_run_configs(tmp_path / "sweep", change, stale)
    assert aggregate.main([str(tmp_path / "sweep")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert fragment.format(root=tmp_path / "sweep") in captured.err


def test_a_run_directory_copied_over_another_seed_is_refused(tmp_path, capsys):
    """base/seed1 copied to base/seed2 was counted as a second seed: '2/2' and a std over one run twice."""
    import shutil

    aggregate = load_script("scripts/aggregate.py")
    sweep_with_hypotheses(tmp_path / "sweep", tmp_path / "data")
    shutil.rmtree(tmp_path / "sweep" / "base" / "seed2")
    shutil.copytree(tmp_path / "sweep" / "base" / "seed1", tmp_path / "sweep" / "base" / "seed2")
    assert aggregate.main([str(tmp_path / "sweep")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "base/seed2/result.json is the result of base/seed1 (seed 1), not of base/seed2 (seed 2)" in err
