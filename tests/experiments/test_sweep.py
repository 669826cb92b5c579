"""The sweep on tiny demo-corpus runs: planning, skipping finished runs, resuming interrupted ones, results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rpr_mt import checkpoint_files as ckpt
from rpr_mt.config import config_from_dict, config_to_dict, load_config, save_config
from rpr_mt.data.prepare import prepare, reference_files
from rpr_mt.lines import read_lines
from rpr_mt.errors import UserError
from rpr_mt.evaluate import score
from rpr_mt.experiments.lengths import length_table, render_length_table
from rpr_mt.experiments.sweep import (
    LATER_SETTINGS,
    comparable_config,
    config_fingerprint,
    is_finished,
    only_run_name,
    plan_runs,
    recorded_decode,
    recorded_fingerprints,
    run_config,
    run_state,
    run_sweep,
)
from rpr_mt.experiments.tables import load_sweep
from rpr_mt.provenance import code_version
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


@pytest.mark.parametrize("received", ["SIGTERM", "SIGHUP", "SIGINT", None])
def test_a_run_whose_training_a_signal_stopped_ends_the_sweep_with_that_signal(base_config, tmp_path, monkeypatch,
                                                                                received):
    """A scheduler's SIGTERM stopped a run's training: the sweep returned "signal" and its script exited 130, as for
    Ctrl-C; it returns the signal's name (None, a DDP rank stopped by another's: SIGINT), for 128 + its number."""
    import rpr_mt.train.trainer as trainer

    def stopped(cfg, **kwargs):
        return trainer.TrainResult(run_dir=Path(cfg.train.run_dir), step=3, epoch=1, stopped_by="signal",
                                   best_bleu=None, last_checkpoint=None, parameters=1, signal=received)

    monkeypatch.setattr(trainer, "train", stopped)
    messages: list[str] = []
    status = run_sweep(base_config, tmp_path / "sweep", ["positions"], [1], log=messages.append)
    name = received or "SIGINT"
    assert status == name
    assert messages[-1] == f"positions=absolute/seed1: stopped by {name}; run the same command again to resume"
    assert not list((tmp_path / "sweep").glob("*/seed1/result.json"))  # the first run stopped, no other began


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
    followed: list[str] = []  # after_run sees each run once it is finished, in the plan's order

    def after_run(run_cfg):
        assert is_finished(run_cfg)
        followed.append(Path(run_cfg.train.run_dir).relative_to(root).as_posix())
        messages.append(f"after_run {followed[-1]}")

    assert run_sweep(base_config, root, ["positions"], [1], log=messages.append, after_run=after_run) == "done"
    assert followed == [run.directory for run in runs]
    # ... before the next run starts: the sweep's own lines and the calls interleave run by run
    events = [m for m in messages if m.startswith("after_run") or ": training (" in m]
    assert events == [e for run in runs for e in (f"[{runs.index(run) + 1}/2] {run.directory}: training ("
                                                  f"{', '.join(f'{t} {c}' for t, c in run.cells)})",
                                                  f"after_run {run.directory}")]
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
    followed.clear()
    assert run_sweep(base_config, root, ["positions"], [1], log=messages.append, after_run=after_run) == "done"
    assert sum("finished, skipped" in m for m in messages) == 2
    assert followed == [run.directory for run in runs]  # runs found finished are followed too
    assert stamps == {d: (root / d / "result.json").stat().st_mtime_ns for d in results}

    # Killed after training but before its result: only decoded again, from the same checkpoint.
    (root / "base/seed1" / "result.json").unlink()
    capsys.readouterr()
    run_sweep(base_config, root, ["positions"], [1], log=messages.append)
    again = json.loads((root / "base/seed1" / "result.json").read_text())
    assert again["updates"] == 12 and again["dev_bleu"] == pytest.approx(results["base/seed1"]["dev_bleu"])
    # the trainer's word for it names no CLI option: a sweep has no --more-steps
    err = capsys.readouterr().err
    assert "is already finished" in err and "--more-steps" not in err

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


def test_list_says_which_runs_are_running_now_and_which_were_started(base_config, tmp_path):
    """--list called a run 'to do' while another job trained or decoded it (launching its command again was refused,
    or decoded it a second time beside the first) and when an interrupted job had left checkpoints (its command
    resumes): a cluster user could not tell what to launch. A second job on a run that one is running is refused."""
    import fcntl

    from rpr_mt.checkpoint_files import STEP_PATTERN
    from rpr_mt.experiments import sweep as sweep_module
    from rpr_mt.train.run_dir import RunDirLock

    assert sweep_module._TRAIN_LOCK == RunDirLock.NAME and sweep_module._STEP_CHECKPOINT.pattern == STEP_PATTERN.pattern
    run = plan_runs(str(base_config), ["key_value"], [1], [])[0]
    cfg = run_config(str(base_config), [], run, str(tmp_path))
    run_dir = Path(cfg.train.run_dir)
    assert run_state(cfg) == "to do"
    checkpoints = run_dir / "checkpoints"
    checkpoints.mkdir(parents=True)
    assert cfg.train.max_steps == 12
    for step in (4, 8):
        (checkpoints / f"checkpoint_{step:08d}.pt").write_bytes(b"")
    (checkpoints / "checkpoint_best.pt").write_bytes(b"")
    assert run_state(cfg) == "started: resumes from update 8"
    with RunDirLock(run_dir) as lock:  # a training (`rpr-mt train` into it, or a job's)
        assert lock.acquired and run_state(cfg) == "running now"
    with sweep_module._holding_run(run_dir):  # a job preparing or decoding it
        assert run_state(cfg) == "running now"
        with pytest.raises(UserError, match="being run by another sweep job"):
            with sweep_module._holding_run(run_dir):
                pass
    assert run_state(cfg) == "started: resumes from update 8"
    for held in (run_dir, run_dir / RunDirLock.NAME):  # the probes leave no lock behind
        fd = os.open(held, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    assert sorted(p.name for p in run_dir.parent.iterdir()) == [run_dir.name]  # no lock file beside the run
    # trained to its max_steps but not decoded (a job stopped while decoding): the next job only decodes it
    (checkpoints / f"checkpoint_{cfg.train.max_steps:08d}.pt").write_bytes(b"")
    assert run_state(cfg) == f"trained to update {cfg.train.max_steps}: decodes it"


def _raw(cfg) -> dict:
    from rpr_mt.config import config_to_dict

    return config_to_dict(cfg)


# The settings of a config.yaml written on 2026-11-23 by the code that trained the position study (dc4079e), whose
# finished runs are found by fingerprint. A setting added since must be in LATER_SETTINGS (with its default and the
# behaviour before it), or every run recorded before it would count as unfinished and be trained and decoded again.
SETTINGS_WHEN_FINGERPRINTED = {
    "data": ["source", "src_lang", "tgt_lang", "output_dir", "multi30k_dir", "splits", "demo_sizes", "demo_seed",
             "max_train_pairs", "max_train_tokens", "max_words", "max_length_ratio", "dedup", "vocab_size",
             "spm_model_type", "spm_character_coverage", "spm_sample_sentences"],
    "model": ["preset", "d_model", "n_heads", "encoder_layers", "decoder_layers", "ff_dim", "dropout",
              "attention_dropout", "activation_dropout", "norm", "positions", "absolute_kind", "max_positions", "clip",
              "use_key", "use_value", "share_across_heads", "t5", "xl", "rope"],
    "train": ["seed", "max_tokens", "update_freq", "max_steps", "max_epochs", "max_time", "lr_schedule", "lr_scale",
              "peak_lr", "warmup_steps", "warmup_fraction", "final_lr_fraction", "adam_betas", "adam_eps",
              "weight_decay", "label_smoothing", "clip_norm", "precision", "save_every", "keep_last", "validate_every",
              "valid_bleu", "valid_max_sentences", "valid_beam_size", "patience", "max_bad_updates", "average_last"],
    "decode": ["beam_size", "length_penalty", "max_len_a", "max_len_b", "max_tokens", "nbest"],
}


def test_settings_added_since_runs_were_fingerprinted_are_declared(base_config):
    comparable = comparable_config(load_config(base_config))
    added = {(section, key) for section, values in comparable.items() for key in values
             if key not in SETTINGS_WHEN_FINGERPRINTED[section]}
    assert added == set(), f"settings added since runs were fingerprinted, missing from LATER_SETTINGS: {added}"
    assert {section for section, _ in LATER_SETTINGS} <= set(SETTINGS_WHEN_FINGERPRINTED)


def test_a_setting_added_later_changes_the_fingerprint_only_off_its_default(base_config):
    raw = config_to_dict(load_config(base_config))
    old = {section: {k: v for k, v in values.items() if (section, k) not in LATER_SETTINGS}
           for section, values in raw.items()}  # a config.yaml written before those settings existed
    assert config_fingerprint(config_from_dict(old)) == config_fingerprint(config_from_dict(raw))
    raw["decode"]["min_length"] = 0
    assert config_fingerprint(config_from_dict(raw)) != config_fingerprint(config_from_dict(old))


def test_where_multi30k_is_read_from_is_no_setting_and_records_that_counted_it_still_match(base_config):
    """The committed Multi30k configs named ../shared/data/multi30k, and the fingerprints and plans of their runs
    (results/) hold it; the configs now name none (the download, or $RPR_MT_MULTI30K_DIR): those runs are finished."""
    import hashlib

    raw = config_to_dict(load_config(base_config))
    raw["data"].update(source="multi30k", multi30k_dir="../shared/data/multi30k", demo_sizes={"train": 20000})
    named = config_from_dict(raw)
    raw["data"]["multi30k_dir"] = None
    unnamed = config_from_dict(raw)
    assert "multi30k_dir" not in comparable_config(unnamed)["data"]
    assert config_fingerprint(named) == config_fingerprint(unnamed)
    # the fingerprint as it was computed while the directory counted, from the committed config's settings
    old = comparable_config(named)
    old["data"]["multi30k_dir"] = "../shared/data/multi30k"
    recorded = hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:16]
    assert recorded != config_fingerprint(unnamed) and recorded in recorded_fingerprints(unnamed)
    old["data"]["multi30k_dir"] = "/another/copy"  # a copy this config does not name: another record
    other = hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:16]
    assert other not in recorded_fingerprints(unnamed)


def test_a_plan_that_recorded_where_multi30k_was_read_from_is_the_same_sweep(base_config, tmp_path):
    from rpr_mt.experiments.sweep import _base_settings, check_base_settings

    recorded = _base_settings(base_config, [])
    recorded["data"]["multi30k_dir"] = None  # as plans recorded it before it was left out
    assert check_base_settings({"runs": {}, "base_settings": recorded}, tmp_path, base_config, []) == \
        _base_settings(base_config, [])
    recorded["data"]["vocab_size"] += 1
    with pytest.raises(UserError, match=r"changed since this sweep planned its runs .*data.vocab_size"):
        check_base_settings({"runs": {}, "base_settings": recorded}, tmp_path, base_config, [])


def test_recorded_decode_fills_in_the_behaviour_before_a_setting():
    assert recorded_decode({"beam_size": 4, "length_penalty": 0.6}) == {"beam_size": 4, "length_penalty": 0.6,
                                                                          "min_length": 0}
    new = {"beam_size": 4, "length_penalty": 0.6, "max_len_a": 1.5, "max_len_b": 10, "min_length": 1}
    assert recorded_decode({"beam_size": 4, "length_penalty": 0.6, "decode": new}) == new



@pytest.mark.parametrize("script, config", [("scripts/sweep.py", "configs/multi30k_en_de_rel.yaml"),
                                            ("scripts/study_positions.py", "configs/multi30k_en_de_positions.yaml")])
@pytest.mark.parametrize("under", [False, True])
def test_root_that_is_a_file_is_one_error_line(script, config, under, tmp_path):
    # Was a FileExistsError traceback from the plan writer's mkdir; nothing may be trained or written.
    (tmp_path / "afile").write_text("x\n")
    root = tmp_path / "afile" / "sub" if under else tmp_path / "afile"
    done = subprocess.run([sys.executable, script, config, "--root", str(root), "--seeds", "1"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: --root ") and len(done.stderr.splitlines()) == 1, done.stderr
    assert "afile" in done.stderr and "Traceback" not in done.stderr
    assert (tmp_path / "afile").read_text() == "x\n"


def test_unreadable_plan_is_one_error(base_config, tmp_path):
    (tmp_path / "plan.json").write_text('{"runs": {')
    with pytest.raises(UserError, match="plan.json: cannot read the sweep's plan"):
        run_sweep(base_config, tmp_path, ["positions"], [1], log=lambda _: None)


def test_a_base_config_edited_since_the_plan_is_one_error_naming_the_change(base_config, tmp_path):
    """The runs under a root were trained with the base config's settings when it was planned: after an edit, a
    finished run was refused with advice to pass --overwrite (sweep.py has none) and --list called it 'to do'."""
    from rpr_mt.experiments.sweep import write_plan

    config = tmp_path / "base.yaml"  # a copy, edited in place below as a user would
    config.write_text(base_config.read_text(encoding="utf-8"), encoding="utf-8")
    root = tmp_path / "root"
    write_plan(root, config, [], plan_runs(config, ["positions"], [1], []))
    write_plan(root, config, [], plan_runs(config, ["positions"], [1, 2], []))  # unchanged settings: fine
    assert "seed" not in json.loads((root / "plan.json").read_text())["base_settings"]["train"]
    before = load_config(config).train.peak_lr
    config.write_text(config.read_text(encoding="utf-8").replace("peak_lr:", "peak_lr: 0.00123 #"), encoding="utf-8")
    assert load_config(config).train.peak_lr == 0.00123
    with pytest.raises(UserError, match=rf"changed since this sweep planned its runs .*\(train\.peak_lr: {before} -> "
                                        r"0\.00123\): .*another --root"):
        write_plan(root, config, [], plan_runs(config, ["positions"], [1], []))
    # another file with other settings is not an edit of the root's config to restore
    other = tmp_path / "other.yaml"
    other.write_text(config.read_text(encoding="utf-8"), encoding="utf-8")
    with pytest.raises(UserError, match=rf"{root} holds a sweep planned with {config}, whose settings differ from "
                                        rf"{other}'s .*train\.peak_lr: {before} -> 0\.00123.*: start this sweep in "
                                        r"another --root"):
        write_plan(root, other, [], plan_runs(other, ["positions"], [1], []))


def test_a_mistyped_only_leaves_the_root_untouched(base_config, tmp_path):
    root = tmp_path / "root"
    with pytest.raises(UserError, match=r"--only .bse/seed1. is not a run of this sweep \(the runs: .*base/seed1"):
        run_sweep(base_config, root, ["positions"], [1], only=["bse/seed1"], log=lambda _: None)
    assert not (root / "plan.json").exists()


def _plan_one(args: tuple[str, str, int]) -> str | None:
    """One cluster job's planning (a process of its own): merge one run into the shared root's plan."""
    from rpr_mt.experiments.sweep import Run, write_plan

    root, config, index = args
    try:
        write_plan(root, config, [], [Run(f"clip={index}", 1, [f"model.clip={index}"], [("clip", f"k={index}")])])
    except Exception as exc:  # reported to the test, which fails on it
        return f"{type(exc).__name__}: {exc}"
    return None


def test_parallel_jobs_merge_their_runs_into_one_plan(base_config, tmp_path):
    """The cluster mode (--list prints one --only command per run) runs the sweep's processes at once: each rewrote
    plan.json through one shared temporary name without a lock, and some failed (FileNotFoundError on the rename)
    or dropped the others' runs."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    for attempt in range(5):
        root = tmp_path / f"root{attempt}"
        with context.Pool(8) as pool:
            errors = pool.map(_plan_one, [(str(root), str(base_config), i) for i in range(16)])
        assert errors == [None] * 16
        plan = json.loads((root / "plan.json").read_text())
        assert sorted(plan["runs"]) == sorted(f"clip={i}/seed1" for i in range(16))
        assert [p.name for p in root.iterdir()] == ["plan.json"]  # no temporary, no lock file left


def test_the_base_config_by_another_spelling_or_an_identical_copy_is_the_same_sweep(base_config, tmp_path,
                                                                                      monkeypatch):
    """plan.json's config path was compared as a string: ./base.yaml after base.yaml (or an absolute path) was
    "another base config", though the recorded settings are what decide."""
    from rpr_mt.experiments.sweep import write_plan

    monkeypatch.chdir(base_config.parent)
    root = tmp_path / "root"
    write_plan(root, base_config.name, [], plan_runs(base_config, ["positions"], [1], []))
    copy = tmp_path / "renamed.yaml"
    copy.write_text(base_config.read_text(encoding="utf-8"), encoding="utf-8")
    for spelling in (f"./{base_config.name}", str(base_config), str(copy)):
        write_plan(root, spelling, [], plan_runs(base_config, ["positions"], [2], []))
    plan = json.loads((root / "plan.json").read_text())
    assert plan["config"] == base_config.name and set(plan["runs"]) >= {"base/seed1", "base/seed2"}
    copy.write_text(copy.read_text(encoding="utf-8").replace("peak_lr:", "peak_lr: 0.00123 #"), encoding="utf-8")
    with pytest.raises(UserError, match="holds a sweep planned with base.yaml, whose settings differ from"):
        write_plan(root, copy, [], plan_runs(base_config, ["positions"], [1], []))
    legacy = json.loads((root / "plan.json").read_text())
    del legacy["base_settings"]  # a plan from before settings were recorded: the file must be the same
    (root / "plan.json").write_text(json.dumps(legacy))
    with pytest.raises(UserError, match="belongs to a sweep of"):
        write_plan(root, copy, [], plan_runs(base_config, ["positions"], [1], []))
    write_plan(root, f"./{base_config.name}", [], plan_runs(base_config, ["positions"], [1], []))  # the same file


def test_list_and_running_agree_on_a_plan_from_before_settings_were_recorded(base_config, tmp_path, monkeypatch):
    """The committed roots' plans record no base_settings: there a renamed identical copy (or overrides that change
    nothing) was refused when running, while --list accepted it and printed --only commands that then failed. Both
    now compare the settings of the config file the plan names, read again."""
    from rpr_mt.experiments.sweep import check_plan, write_plan
    from tests.scripts import load_script

    sweep_script = load_script("scripts/sweep.py")
    monkeypatch.chdir(base_config.parent)
    copy = tmp_path / "renamed.yaml"
    copy.write_text(base_config.read_text(encoding="utf-8"), encoding="utf-8")
    root = tmp_path / "legacy"
    root.mkdir()
    legacy = {"config": base_config.name, "overrides": [], "runs": {}}
    (root / "plan.json").write_text(json.dumps(legacy))
    for config, overrides in ((copy, []), (f"./{base_config.name}", ["train.num_threads=1"])):
        check_plan(legacy, root, config, overrides)
        listed = ["--root", str(root), "--tables", "positions", "--seeds", "1", "--list"]
        assert sweep_script.main([str(config), *listed, *(f"--set={o}" for o in overrides)]) == 0
    write_plan(root, copy, [], plan_runs(copy, ["positions"], [1], []))
    plan = json.loads((root / "plan.json").read_text())
    assert (plan["config"], plan["overrides"]) == (base_config.name, []) and "base_settings" in plan  # first kept
    # Settings that differ, or a named file not found from here, are refused by both alike
    copy.write_text(copy.read_text(encoding="utf-8").replace("peak_lr:", "peak_lr: 0.00123 #"), encoding="utf-8")
    for plan in (legacy, {**legacy, "config": "elsewhere/base.yaml"}):
        (root / "plan.json").write_text(json.dumps(plan))
        with pytest.raises(UserError, match="belongs to a sweep of .* not known to have the settings of"):
            write_plan(root, copy, [], plan_runs(copy, ["positions"], [1], []))
        assert sweep_script.main([str(copy), "--root", str(root), "--tables", "positions", "--seeds", "1",
                                  "--list"]) == 2
    with pytest.raises(UserError, match="not found from here: run where the sweep was planned"):
        check_plan({**legacy, "config": "elsewhere/base.yaml"}, root, base_config, [])


def test_a_set_of_what_the_sweep_sets_itself_is_refused(base_config):
    """--set train.seed=5 and --set train.run_dir=... were accepted and then replaced by --seeds and --root."""
    for override, owner in (("train.seed=5", "--seeds"), ("train.run_dir=/tmp/x", "--root")):
        with pytest.raises(UserError, match=rf"--set {override}: a sweep sets .* from {owner}"):
            plan_runs(base_config, ["positions"], [1], [override])


def test_a_table_or_seed_named_twice_is_planned_once(base_config):
    """--tables positions positions (or a repeated seed) listed each cell twice in its run and in the log."""
    runs = plan_runs(base_config, ["positions", "clip", "positions"], [2, 1, 2], [])
    assert [run.directory for run in runs] == [run.directory for run in plan_runs(base_config, ["positions", "clip"],
                                                                                   [2, 1], [])]
    base = next(run for run in runs if run.directory == "base/seed2")
    assert base.cells == [("positions", "relative"), ("clip", "k=4")]


def test_only_takes_the_path_a_shell_completes(tmp_path, monkeypatch):
    """--only ROOT/base/seed1 (completed from outside the root) was 'no such run in this sweep'."""
    root = tmp_path / "sweeps" / "sw1"
    monkeypatch.chdir(tmp_path)
    for given in ("base/seed1", "base/seed1/", str(root / "base" / "seed1"), "sweeps/sw1/base/seed1/",
                  "./sweeps/sw1/./base/seed1"):
        assert only_run_name(given, "sweeps/sw1") == "base/seed1"
    root.mkdir(parents=True)
    monkeypatch.chdir(root)
    assert only_run_name("./base/seed1", ".") == "base/seed1"
    assert only_run_name("bse/seed1", str(root)) == "bse/seed1"  # still refused by name, as a typo


def test_a_damaged_result_is_a_run_to_do_again_not_a_traceback(base_config, tmp_path):
    """A result.json holding valid JSON that is not an object, or bytes that are not UTF-8, ended --list and the
    sweep in a traceback (AttributeError, UnicodeDecodeError); a cut-off one was already a run to do again."""
    (run,) = [r for r in plan_runs(base_config, ["positions"], [1], []) if r.directory == "base/seed1"]
    cfg = run_config(base_config, [], run, tmp_path)
    path = Path(cfg.train.run_dir) / "result.json"
    path.parent.mkdir(parents=True)
    for content in (b"[]", b"\xff\xfe{", b'{"fingerprint": '):
        path.write_bytes(content)
        assert not is_finished(cfg) and run_state(cfg) == "to do"


def test_a_sweep_whose_log_reader_goes_away_finishes_its_run(base_config, tmp_path):
    """`sweep.py ... 2>&1 | head -3`: the next log line raised BrokenPipeError, which the handler meant for
    `--list | head` turned into exit 0, with the run neither trained to the end nor decoded."""
    root = tmp_path / "root"
    proc = subprocess.Popen(
        [sys.executable, "scripts/sweep.py", str(base_config), "--root", str(root), "--tables", "positions",
         "--seeds", "1", "--only", "base/seed1"], cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    for _ in range(3):
        proc.stderr.readline()
    proc.stderr.close()
    assert proc.wait(timeout=300) == 0
    assert (root / "base" / "seed1" / "result.json").is_file()


def test_a_sweep_error_after_its_log_reader_left_still_exits_2(base_config, tmp_path):
    """The error's line went to a closed pipe: BrokenPipeError, which the `--list | head` handler made exit 0, so a
    failed sweep job read as a success."""
    proc = subprocess.Popen(
        [sys.executable, "scripts/sweep.py", str(base_config), "--root", str(tmp_path / "root"), "--tables",
         "positions", "--seeds", "1", "--only", "bse/seed1"], cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    proc.stderr.close()
    assert proc.wait(timeout=120) == 2
