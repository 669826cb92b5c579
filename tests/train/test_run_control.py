"""Steering a run: N more updates, fine-tuning from a checkpoint, TensorBoard scalars, the progress bar's time left,
the slowdown warning and the dev scores kept in checkpoints (tiny models on the demo corpus, seconds each)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from pathlib import Path

import pytest
import torch
import yaml

from rpr_mt import checkpoint_files as ckpt
from rpr_mt.config import config_from_dict
from rpr_mt.errors import UserError
from rpr_mt.train import trainer
from rpr_mt.train.trainer import train
from tests.train.test_trainer import demo_data, final_weights, tiny  # noqa: F401 (demo_data is a fixture)


def run(raw: dict, **kwargs) -> tuple[trainer.TrainResult, str]:
    """Train and return the result with everything the run wrote to stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        result = train(config_from_dict(raw), **kwargs)
    return result, err.getvalue()


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def adam_step(state: dict) -> float:
    return float(state["optimizer"]["state"][0]["step"])


# -- N more updates ----------------------------------------------------------------------------------------------------


def test_more_steps_continues_the_latest_checkpoint_exactly(tmp_path, demo_data):
    train(config_from_dict(tiny(demo_data, tmp_path / "whole")), progress=False)  # 12 updates in one go
    raw = tiny(demo_data, tmp_path / "run", train={"max_steps": 6})
    first, _ = run(raw, progress=False)
    assert first.step == 6 and first.stopped_by == "max_steps"
    result, err = run(raw, progress=False, more_steps=6)  # the same config: its max_steps is already reached
    assert f"resuming from {ckpt.step_checkpoint_path(tmp_path / 'run', 6)}" in err
    assert "training to update 12" in err
    assert result.step == 12 and result.stopped_by == "max_steps"
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["train"]["max_steps"] == 12
    a, b = final_weights(tmp_path / "whole"), final_weights(tmp_path / "run")
    assert all(torch.equal(a[key], b[key]) for key in a)  # the same as planning 12 updates from the start
    # update 6 lies off the save grid (every 4): the finished run's last checkpoint stays, where an interrupted run's
    # off-grid checkpoint is dropped once the resumed run saves past it
    kept = [path.name for path in ckpt.list_step_checkpoints(tmp_path / "run")]
    assert kept == [f"checkpoint_{step:08d}.pt" for step in (4, 6, 8, 12)]


def test_a_finished_runs_last_checkpoint_stays_when_a_raised_max_steps_continues_it(tmp_path, demo_data):
    """The other way to continue a finished run (the budget schedule's only one, with max_time): a raised limit. The
    run is then unfinished under the new config, and its off-grid last checkpoint was dropped as an interrupted
    run's would be."""
    train(config_from_dict(tiny(demo_data, tmp_path / "run", train={"max_steps": 6})), progress=False)
    assert ckpt.load_checkpoint(ckpt.step_checkpoint_path(tmp_path / "run", 6))["stopped_by"] == "max_steps"
    result = train(config_from_dict(tiny(demo_data, tmp_path / "run", train={"max_steps": 10})), progress=False)
    assert result.step == 10
    assert [path.name for path in ckpt.list_step_checkpoints(tmp_path / "run")] == [
        f"checkpoint_{step:08d}.pt" for step in (4, 6, 8, 10)]


def test_more_steps_lifts_the_other_stopping_rules(tmp_path, demo_data):
    raw = tiny(demo_data, tmp_path / "run", train={"max_steps": 4, "max_time": 0.001})  # time is up at once
    first, _ = run(raw, progress=False)
    assert first.stopped_by == "max_time" and first.step < 4
    result, _ = run(raw, progress=False, more_steps=3)
    assert result.step == first.step + 3 and result.stopped_by == "max_steps"


def test_more_steps_needs_a_checkpoint_and_a_step_based_schedule(tmp_path, demo_data):
    with pytest.raises(UserError, match="no checkpoint to continue"):
        train(config_from_dict(tiny(demo_data, tmp_path / "empty")), progress=False, more_steps=5)
    raw = tiny(demo_data, tmp_path / "budget",
               train={"max_steps": None, "max_time": 0.001, "lr_schedule": "budget"})
    run(raw, progress=False)
    with pytest.raises(UserError, match="budget.*train.max_time"):
        train(config_from_dict(raw), progress=False, more_steps=5)
    with pytest.raises(UserError, match="--more-steps must be >= 1"):
        train(config_from_dict(raw), progress=False, more_steps=0)


def test_more_steps_refuses_an_unfinished_run_and_changes_nothing(tmp_path, demo_data):
    """--more-steps on a run that its command has not finished counted N from the latest checkpoint: it shortened
    the run (config.yaml's max_steps 8 became 4 + 2) and squeezed a step-based schedule into those updates, until the
    plain command went back to 8. It is refused, naming where the run trains to, before anything is written."""
    run_dir = tmp_path / "run"
    raw = tiny(demo_data, run_dir, train={"max_steps": 4, "validate_every": 100, "valid_bleu": False})
    run(raw, progress=False)
    before = files(run_dir)
    for limits, target in (({"max_steps": 8}, r"it trains to update 8 \(now at 4\)"),
                           ({"max_steps": None, "max_epochs": 1}, r"it trains for 1 epoch\(s\) \(0 done\)"),
                           ({"max_steps": None, "max_time": 3600}, r"it trains for 3600s \(it has trained \d+s\)")):
        unfinished = {**raw, "train": {**raw["train"], **limits}}
        with pytest.raises(UserError, match=rf"^--more-steps: {re.escape(str(run_dir))} is not finished: {target}; "
                                            r"run the same command without --more-steps to resume it$"):
            run(unfinished, progress=False, more_steps=2)
        assert files(run_dir) == before
    result, _ = run(raw, progress=False, more_steps=2)  # finished by its command's max_steps: continued
    assert result.step == 6 and result.max_steps == 6


def test_more_steps_with_overwrite_is_refused_before_the_run_is_deleted(tmp_path, demo_data):
    """--overwrite deleted the run (another config) that --more-steps was then to continue, and failed for want of a
    checkpoint. The pair contradicts itself and is refused first, whether or not the config differs."""
    run_dir = tmp_path / "run"
    raw = tiny(demo_data, run_dir, train={"max_steps": 2, "valid_bleu": False})
    run(raw, progress=False)
    before = files(run_dir)
    other = tiny(demo_data, run_dir, model={"clip": 2}, train={"max_steps": 2, "valid_bleu": False})
    for config in (other, raw):
        with pytest.raises(UserError, match=rf"^--more-steps continues the run in {re.escape(str(run_dir))} and "
                                            r"--overwrite deletes it: pass one or the other$"):
            run(config, progress=False, more_steps=2, overwrite=True)
        assert files(run_dir) == before


# -- fine-tuning from a checkpoint --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, demo_data) -> Path:
    run_dir = tmp_path_factory.mktemp("pretrained") / "run"
    train(config_from_dict(tiny(demo_data, run_dir, train={"max_steps": 8})), progress=False)
    return ckpt.step_checkpoint_path(run_dir, 8)


@pytest.mark.parametrize("reset", [True, False])
def test_init_from_starts_a_new_run_from_the_checkpoint_weights(tmp_path, demo_data, pretrained, reset):
    # A learning rate of 1e-9 moves no weight by more than ~1e-8 in two Adam steps: the result is the source's weights.
    raw = tiny(demo_data, tmp_path / "ft", train={"max_steps": 2, "init_from": str(pretrained),
                                                  "reset_optimizer": reset, "peak_lr": 1e-9, "valid_bleu": False})
    result, err = run(raw, progress=False)
    assert f"initialised from {pretrained} (update 8" in err
    assert ("optimizer reset" if reset else "optimizer state loaded") in err
    assert result.step == 2  # the fine-tuning run counts its own updates
    state = ckpt.load_checkpoint(ckpt.step_checkpoint_path(tmp_path / "ft", 2))
    source = ckpt.load_checkpoint(pretrained)
    for key, value in source["model"].items():
        assert torch.allclose(state["model"][key], value, atol=1e-6), key
    assert adam_step(state) == (2 if reset else 8 + 2)  # Adam's own count: fresh moments or the source's
    # Running the same command again resumes the fine-tuning run, not the source.
    raw["train"]["max_steps"] = 3
    result, err = run(raw, progress=False)
    assert result.step == 3 and "train.init_from is not used" in err


def test_init_from_rejects_another_vocabulary_and_a_missing_optimizer(tmp_path, demo_data, pretrained):
    state = ckpt.load_checkpoint(pretrained)
    state["vocab"] = {**state["vocab"], "fingerprint": "0" * 64}
    foreign = tmp_path / "foreign.pt"
    ckpt.save_checkpoint(state, foreign)
    raw = tiny(demo_data, tmp_path / "a", train={"max_steps": 1, "init_from": str(foreign)})
    with pytest.raises(UserError, match="another vocabulary"):
        train(config_from_dict(raw), progress=False)
    averaged = tmp_path / "avg.pt"
    ckpt.save_checkpoint(ckpt.average_checkpoints([pretrained]), averaged)
    raw = tiny(demo_data, tmp_path / "b", train={"max_steps": 1, "init_from": str(averaged), "reset_optimizer": False})
    with pytest.raises(UserError, match="no optimizer state.*reset_optimizer=true"):
        train(config_from_dict(raw), progress=False)
    raw = tiny(demo_data, tmp_path / "c", train={"max_steps": 1, "init_from": str(tmp_path / "nowhere.pt")})
    with pytest.raises(UserError, match="train.init_from: checkpoint not found"):
        train(config_from_dict(raw), progress=False)
    raw = tiny(demo_data, tmp_path / "d", model={"d_model": 64}, train={"max_steps": 1, "init_from": str(pretrained)})
    # The first mismatch by name and shapes, not torch's header ("Error(s) in loading state_dict for Seq2Seq:").
    with pytest.raises(UserError, match=r"does not fit this model section \(\S+ is \[\d+(, \d+)*\] in the checkpoint "
                                        r"but \[\d+(, \d+)*\] in the model; \d+ more differences\)") as caught:
        train(config_from_dict(raw), progress=False)
    assert "Error(s)" not in str(caught.value)


@pytest.mark.parametrize("change", [{"positions": "rope"}, {"norm": "pre"}])
def test_init_from_rejects_another_computation_with_the_same_weights(tmp_path, demo_data, change):
    """rope, alibi and none have no position weights and pre- and post-norm the same ones: a checkpoint of another
    scheme or norm loaded without a complaint from torch and fine-tuned as another model."""
    source = tmp_path / "alibi"
    train(config_from_dict(tiny(demo_data, source, model={"positions": "alibi"}, train={"max_steps": 1})),
          progress=False)
    raw = tiny(demo_data, tmp_path / "ft", model={"positions": "alibi", **change},
               train={"max_steps": 1, "init_from": str(source)})
    key, value = next(iter(change.items()))
    default = {"positions": "alibi", "norm": "post"}[key]
    with pytest.raises(UserError, match=rf"does not fit this model section \(model.{key} is {default} in the "
                                        rf"checkpoint but {value} here\)"):
        train(config_from_dict(raw), progress=False)
    raw["model"] = {**raw["model"], key: default, "dropout": 0.3}  # the source's setting; dropout may change
    train(config_from_dict(raw), progress=False)


# -- the run directory, before any work ---------------------------------------------------------------------------------


def test_a_run_dir_below_a_file_is_refused_before_any_work(tmp_path):
    (tmp_path / "afile").write_text("x\n")
    raw = tiny(tmp_path / "data", tmp_path / "afile" / "run")
    with pytest.raises(UserError, match=r"train.run_dir: \S+afile/run cannot be created: \S+afile is not a directory"):
        train(config_from_dict(raw), progress=False)
    assert not (tmp_path / "data").exists()  # refused before preparing the data


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_a_run_dir_in_a_read_only_directory_is_refused_before_any_work(tmp_path):
    (tmp_path / "locked").mkdir(mode=0o555)
    raw = tiny(tmp_path / "data", tmp_path / "locked" / "run")
    with pytest.raises(UserError, match=r"locked/run cannot be created: \S+locked is not writable"):
        train(config_from_dict(raw), progress=False)
    assert not (tmp_path / "data").exists()


# -- the end of a run, and its command again ---------------------------------------------------------------------------


def files(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_the_last_update_is_validated_before_its_checkpoint_is_written_once(tmp_path, demo_data):
    """max_steps 10 is on the save grid (5) but not the validation grid (4): the final checkpoint carries the final
    validation's scores, and the command run again changes nothing (no second dev record, no rewritten files)."""
    run_dir = tmp_path / "run"
    raw = tiny(demo_data, run_dir, train={"max_steps": 10, "save_every": 5, "validate_every": 4, "valid_bleu": False})
    run(raw, progress=False)
    last = ckpt.load_checkpoint(ckpt.step_checkpoint_path(run_dir, 10))
    assert last["dev"] is not None and last["dev"]["step"] == 10
    assert "no dev score recorded" not in ckpt.describe_checkpoint(last)
    assert [r["step"] for r in metrics(run_dir) if "dev_nll" in r] == [4, 8, 10]

    before = files(run_dir)
    for max_steps in (10, 8):  # the same command, and one whose max_steps the run has passed
        result, err = run({**raw, "train": {**raw["train"], "max_steps": max_steps}}, progress=False)
        assert result.step == 10 and result.stopped_by == "max_steps"
        assert f"is already finished (it is at update 10, and train.max_steps is {max_steps}): nothing to train" in err
        assert "validation at" not in err
        assert files(run_dir) == before


def train_steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in metrics(run_dir) if "loss" in r]


def fixed_validation(run: trainer.Trainer) -> None:
    """A validation whose dev NLL never changes: the first improves on none, each later one is a bad one."""
    run.state.add_validation({"step": run.state.step, "nll": 1.0, "bleu": None})


@pytest.mark.parametrize("stop, sections, steps", [
    ("max_steps", {"max_steps": 12}, [1, 5, 10, 12]),
    ("max_epochs", {"max_steps": None, "max_epochs": 1}, [1, 5, 10, 15, 20, 24]),  # the epoch's 24 batches
    ("patience", {"max_steps": 100, "validate_every": 3, "patience": 1}, [1, 5, 6]),
])
def test_the_last_log_window_is_logged_when_the_run_ends_off_the_log_grid(tmp_path, demo_data, monkeypatch, stop,
                                                                          sections, steps):
    """The updates after the last multiple of log_every were never logged (up to log_every - 1 updates of train
    loss missing from metrics.jsonl, TensorBoard and `rpr-mt plot`): the end logs them at its update."""
    monkeypatch.setattr(trainer.Trainer, "validate", fixed_validation)
    raw = tiny(demo_data, tmp_path / "run", train={"log_every": 5, "save_every": 1000, "validate_every": 1000,
                                                    "valid_bleu": False, **sections})
    result, err = run(raw, progress=False)
    assert result.stopped_by == stop and train_steps(tmp_path / "run") == steps == [*steps[:-1], result.step]
    assert f"update {result.step} | epoch 1 | loss" in err
    if stop == "max_steps":  # the window holds updates 11 and 12 alone: the same record as a log_every 2 run's
        run(tiny(demo_data, tmp_path / "other", train={**raw["train"], "run_dir": str(tmp_path / "other"),
                                                        "log_every": 2}), progress=False)
        ours, theirs = ([r for r in metrics(tmp_path / name) if "loss" in r][-1] for name in ("run", "other"))
        assert (ours["step"], ours["loss"], ours["nll"]) == (theirs["step"], theirs["loss"], theirs["nll"])


def test_a_run_stopped_off_the_log_grid_logs_its_last_window_once(tmp_path, demo_data, monkeypatch):
    """A signal after update 7 (log_every 5): the stop logs updates 6-7 at 7, and the resumed run starts after its
    checkpoint at 7, so no update is logged twice; the command of the finished run again logs nothing."""
    import os
    import signal

    raw = tiny(demo_data, tmp_path / "run", train={"max_steps": 12, "log_every": 5, "save_every": 1000,
                                                    "validate_every": 1000, "valid_bleu": False})
    real_step, updates = torch.optim.Adam.step, []

    def step_then_signal(self, *args, **kwargs):
        out = real_step(self, *args, **kwargs)
        updates.append(1)
        if len(updates) == 7:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    with monkeypatch.context() as patch:
        patch.setattr(torch.optim.Adam, "step", step_then_signal)
        stopped, _ = run(raw, progress=False)
    assert stopped.stopped_by == "signal" and stopped.step == 7
    assert train_steps(tmp_path / "run") == [1, 5, 7]
    assert run(raw, progress=False)[0].step == 12
    assert train_steps(tmp_path / "run") == [1, 5, 7, 8, 10, 12]  # 8: the resumed invocation's first update
    run(raw, progress=False)
    assert train_steps(tmp_path / "run") == [1, 5, 7, 8, 10, 12]


def test_the_first_update_after_a_resume_is_logged_as_a_new_runs_first(tmp_path, demo_data):
    """A resumed run reports its first update at once, as a new run reports update 1, instead of staying silent
    until the next multiple of log_every; the record covers that update alone (the same as a log_every 1 run's)."""
    sections = {"log_every": 4, "save_every": 1000, "validate_every": 1000, "valid_bleu": False}
    run(tiny(demo_data, tmp_path / "run", train={**sections, "max_steps": 6}), progress=False)
    result, err = run(tiny(demo_data, tmp_path / "run", train={**sections, "max_steps": 12}), progress=False)
    assert result.step == 12 and train_steps(tmp_path / "run") == [1, 4, 6, 7, 8, 12]
    lines = err.splitlines()
    resumed = next(i for i, line in enumerate(lines) if line.startswith("resuming from"))
    assert lines[resumed + 1].startswith("update 7 | epoch 1 | loss"), lines[resumed:]
    run(tiny(demo_data, tmp_path / "every", train={**sections, "max_steps": 7, "log_every": 1}), progress=False)
    ours, theirs = ({r["step"]: r for r in metrics(tmp_path / name) if "loss" in r}[7] for name in ("run", "every"))
    assert (ours["loss"], ours["nll"]) == (theirs["loss"], theirs["nll"])


def test_the_summary_is_the_last_line_after_the_progress_bar(finished):
    _, err = finished
    screen = [line.split("\r")[-1] for line in err.rstrip().split("\n")]
    assert screen[-1].startswith("stopped by max_steps at update 12"), screen[-3:]


def test_the_summary_names_the_checkpoint_to_use_and_a_command_that_runs(finished):
    """The last line named the last numbered checkpoint; a run that averages its last checkpoints is scored by the
    average: the line names it and the eval-bleu command that scores it, which runs as printed."""
    import shlex

    from typer.testing import CliRunner

    from rpr_mt.cli import app

    run_dir, err = finished
    last = err.rstrip().split("\n")[-1].split("\r")[-1]
    average = ckpt.checkpoint_dir(run_dir) / "checkpoint_avg.pt"
    command = f"rpr-mt eval-bleu --checkpoint {shlex.quote(str(run_dir))} --which average --split test"
    assert f"; use {average} (the average of the checkpoints of updates 4-12): {command}, or rpr-mt translate " \
           f"--checkpoint {shlex.quote(str(run_dir))} --which average -i FILE" in last, last
    assert "checkpoint_00000012.pt" not in last
    result = CliRunner().invoke(app, shlex.split(command)[1:] + ["--device", "cpu"])
    assert result.exit_code == 0 and "BLEU" in result.output and "checkpoint_avg.pt" in result.output, result.output


@pytest.mark.parametrize("files, expected", [
    (["checkpoint_00000004.pt", "checkpoint_best.pt"], "use {folder}/checkpoint_best.pt (the best on dev): rpr-mt "
     "eval-bleu --checkpoint {run} --split test, or rpr-mt translate --checkpoint {run} -i FILE"),
    (["checkpoint_00000004.pt", "checkpoint_00000008.pt"], "use {folder}/checkpoint_00000008.pt (the last: no "
     "validation chose a best one): rpr-mt eval-bleu --checkpoint {run} --which last --split test, or rpr-mt "
     "translate --checkpoint {run} --which last -i FILE"),
    ([], "no checkpoint written"),
])
def test_the_checkpoint_to_use_is_the_best_else_the_last(tmp_path, files, expected):
    from rpr_mt.config import TrainConfig
    from rpr_mt.train.checkpointing import checkpoint_to_use

    run_dir, data_dir = tmp_path / "my run", tmp_path / "data"
    folder = ckpt.checkpoint_dir(run_dir)
    folder.mkdir(parents=True)
    data_dir.mkdir()
    for name in files:
        (folder / name).write_bytes(b"")
    (data_dir / "test.en").write_text("a\n")
    t = TrainConfig(run_dir=str(run_dir))
    said = checkpoint_to_use(run_dir, t, data_dir, "en")
    assert said == expected.format(folder=folder, run=f"'{run_dir}'")  # a path with a space is quoted
    (data_dir / "test.en").unlink()
    (data_dir / "dev.en").write_text("a\n")  # no test split: eval-bleu scores dev
    assert checkpoint_to_use(run_dir, t, data_dir, "en") == expected.format(folder=folder, run=f"'{run_dir}'") \
        .replace("--split test", "--split dev")


# -- what a finished run wrote -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished(tmp_path_factory, demo_data) -> tuple[Path, str]:
    """12 updates, validated at 6 and 12, checkpoints at 4, 8 and 12, asked to average the last 5, with the bar."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    _, err = run(tiny(demo_data, run_dir, train={"average_last": 5}), progress=True)
    return run_dir, err


def test_tensorboard_event_files_hold_the_logged_scalars(finished):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _ = finished
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/tgt_tok_s", "dev/nll", "dev/bleu"} <= tags
    records = metrics(run_dir)
    for tag, key in (("train/loss", "loss"), ("train/lr", "lr"), ("dev/nll", "dev_nll"), ("dev/bleu", "dev_bleu")):
        expected = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        got = [(e.step, e.value) for e in events.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in expected], tag
        assert all(v == pytest.approx(w, rel=1e-6) for (_, v), (_, w) in zip(got, expected)), tag


def test_tensorboard_can_be_turned_off(tmp_path, demo_data):
    run(tiny(demo_data, tmp_path / "run", train={"max_steps": 2, "tensorboard": False}), progress=False)
    assert (tmp_path / "run" / "metrics.jsonl").is_file() and not (tmp_path / "run" / "tensorboard").exists()


def test_progress_bar_counts_to_max_steps_with_the_time_left(finished):
    _, err = finished
    # tqdm's "n/total [elapsed<remaining" is there for every refresh; the last one reaches the total
    assert re.search(r"\b\d+/12 \[\d\d:\d\d<\d\d:\d\d", err), err[-2000:]
    assert "12/12 [" in err


def test_checkpoints_record_the_dev_scores_of_their_own_weights(finished):
    run_dir, _ = finished
    validations = {r["step"]: r for r in metrics(run_dir) if "dev_nll" in r}
    assert sorted(validations) == [6, 12]
    best = ckpt.load_checkpoint(ckpt.checkpoint_dir(run_dir) / "checkpoint_best.pt")
    scores = validations[best["step"]]
    assert best["dev"]["nll"] == scores["dev_nll"] and best["dev"]["bleu"] == scores["dev_bleu"]
    assert best["best_bleu"] == scores["dev_bleu"]  # was the previous best before
    last = ckpt.load_checkpoint(ckpt.step_checkpoint_path(run_dir, 12))
    assert last["dev"]["bleu"] == validations[12]["dev_bleu"]
    assert ckpt.load_checkpoint(ckpt.step_checkpoint_path(run_dir, 8))["dev"] is None  # not validated at 8
    # the dev outputs' 1st-percentile length ratio, which translate's short-output warning reads from the model
    assert best["dev"]["length_ratio_p01"] >= 0.0
    assert ckpt.load_for_inference(run_dir, "best").length_ratio_floor == best["dev"]["length_ratio_p01"]


def test_average_last_with_fewer_checkpoints_warns(finished):
    run_dir, err = finished
    assert "warning: train.average_last is 5 but" in err and "averaging 3" in err
    averaged = ckpt.load_checkpoint(ckpt.checkpoint_dir(run_dir) / "checkpoint_avg.pt")
    assert averaged["averaged_steps"] == [4, 8, 12]


def test_patience_without_a_dev_split_is_named_at_the_start(tmp_path, demo_data):
    """No dev split, no validation: train.patience could never stop the run, and nothing said so."""
    raw = tiny(tmp_path / "data", tmp_path / "run", data={"demo_sizes": {"train": 400}},
               train={"max_steps": 2, "patience": 3})
    result, err = run(raw, progress=False)
    assert result.stopped_by == "max_steps"
    assert (f"warning: train.patience is 3 but {tmp_path / 'data'} has no dev split: nothing is validated, so "
            "patience cannot stop the run") in err
    assert "note:" not in err  # the warning says it already
    _, err = run(tiny(tmp_path / "data", tmp_path / "run2", data={"demo_sizes": {"train": 400}},
                      train={"max_steps": 2}), progress=False)
    assert (f"note: {tmp_path / 'data'} has no dev split: nothing is validated (no dev loss or BLEU, no "
            "checkpoint_best.pt; translate and eval-bleu then take the last checkpoint)") in err
    _, err = run(tiny(demo_data, tmp_path / "with_dev", train={"max_steps": 2, "patience": 3, "valid_bleu": False}),
                 progress=False)
    assert "train.patience" not in err and "no dev split" not in err


# -- the slowdown warning ----------------------------------------------------------------------------------------------


def test_trainer_feeds_each_log_window_but_the_first_to_the_monitor_and_warns_once(tmp_path, demo_data, monkeypatch):
    seen: list[float] = []

    class Monitor:
        def observe(self, rate: float) -> float | None:
            seen.append(rate)
            return 123456.0 if len(seen) == 2 else None  # the monitor's own logic is tested in test_throughput.py

    monkeypatch.setattr(trainer, "ThroughputMonitor", Monitor)
    raw = tiny(demo_data, tmp_path / "run", train={"max_steps": 16, "log_every": 2, "valid_bleu": False})
    _, err = run(raw, progress=False)
    logged = [r["tgt_tok_s"] for r in metrics(tmp_path / "run") if "tgt_tok_s" in r]  # updates 1, 2, 4, ..., 16
    assert seen == logged[1:]
    assert err.count("warning: training slowed") == 1 and "this run's early 123,456" in err


def test_a_dev_measure_changed_on_resume_is_said(tmp_path, demo_data):
    """valid_max_sentences, valid_beam_size and the decode settings of validation may change between invocations,
    but then the best checkpoint and patience compare BLEU measured two ways: the resume says so, once."""
    run = tmp_path / "run"
    train(config_from_dict(tiny(demo_data, run, train={"max_steps": 2})), progress=False)
    unchanged, changed = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(unchanged):
        train(config_from_dict(tiny(demo_data, run, train={"max_steps": 3})), progress=False)
    with contextlib.redirect_stderr(changed):
        train(config_from_dict(tiny(demo_data, run, train={"max_steps": 4, "valid_max_sentences": 8},
                                    decode={"length_penalty": 1.0})), progress=False)
    assert "measured differently" not in unchanged.getvalue()
    warnings = [line for line in changed.getvalue().splitlines() if "measured differently" in line]
    assert len(warnings) == 1 and "train.valid_max_sentences: 5 -> 8" in warnings[0] \
        and "decode.length_penalty: 0.6 -> 1.0" in warnings[0]
