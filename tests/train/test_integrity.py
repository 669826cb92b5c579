"""Checkpoint and run-directory integrity (issue #18): checksums, fallbacks, atomic config, stale temporaries,
interrupted runs keeping the same checkpoints, and resumption that does not depend on how the path is spelled."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

from rpr_mt import checkpoint_files as ckpt
from rpr_mt.config import config_from_dict
from rpr_mt.errors import UserError
from rpr_mt.train import checkpointing
from rpr_mt.train.trainer import train
from tests.train.test_trainer import demo_data, final_weights, tiny  # noqa: F401  (fixture)


def payload(seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {"format": ckpt.FORMAT, "step": 3, "config": {"model": {}}, "vocab": {"size": 4},
            "model": {"w": torch.randn(4, 4, generator=gen), "b": torch.zeros(4), "scale": torch.tensor(2.0)}}


def test_flipped_weight_bytes_are_detected(tmp_path):
    path = tmp_path / "checkpoint_00000003.pt"
    ckpt.save_checkpoint(payload(), path)
    assert torch.equal(ckpt.load_checkpoint(path)["model"]["w"], payload()["model"]["w"])
    raw = torch.load(path, weights_only=True)
    raw["model"]["w"][1, 2] += 1e-3  # a flipped weight, with the old checksum kept
    torch.save(raw, path)
    with pytest.raises(UserError, match="corrupt: its tensors differ from the checksum"):
        ckpt.load_checkpoint(path)


def test_newest_corrupt_checkpoint_falls_back_to_the_previous_one(tmp_path):
    run = tmp_path / "run"
    for step in (4, 8):
        ckpt.save_checkpoint({**payload(step), "step": step}, ckpt.step_checkpoint_path(run, step))
    newest = ckpt.step_checkpoint_path(run, 8)
    newest.write_bytes(newest.read_bytes()[:-100])  # truncated
    warnings: list[str] = []
    path, state = checkpointing.latest_valid_checkpoint(run, warn=warnings.append)
    assert path.name == "checkpoint_00000004.pt" and state["step"] == 4
    assert "checkpoint_00000008.pt" in warnings[0] and "falling back" in warnings[0]


def test_the_oldest_corrupt_checkpoint_says_there_is_none_to_fall_back_to(tmp_path):
    """The last warning promised "falling back to the previous checkpoint" when there was none."""
    run = tmp_path / "run"
    for step in (4, 8):
        path = ckpt.step_checkpoint_path(run, step)
        ckpt.save_checkpoint({**payload(step), "step": step}, path)
        path.write_bytes(path.read_bytes()[:-100])
    warnings: list[str] = []
    assert checkpointing.latest_valid_checkpoint(run, warn=warnings.append) is None
    assert "falling back" in warnings[0] and warnings[1].endswith("; no earlier checkpoint"), warnings


def test_unreadable_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, monkeypatch):
    """An OS error on reading (permissions, I/O) is a UserError like a corrupt file: resumption warns and falls
    back instead of stopping with a traceback. (Tests run as root, so the denied open is simulated.)"""
    run = tmp_path / "run"
    for step in (4, 8):
        ckpt.save_checkpoint({**payload(step), "step": step}, ckpt.step_checkpoint_path(run, step))
    newest = ckpt.step_checkpoint_path(run, 8)

    def open_denied(file, *args, **kwargs):
        if Path(file) == newest:
            raise PermissionError(13, "Permission denied", str(file))
        return open(file, *args, **kwargs)

    monkeypatch.setattr(ckpt, "open", open_denied, raising=False)  # the module's open, not the builtin
    with pytest.raises(UserError, match="cannot be read \\(Permission denied\\)"):
        ckpt.load_checkpoint(newest)
    warnings: list[str] = []
    path, state = checkpointing.latest_valid_checkpoint(run, warn=warnings.append)
    assert path.name == "checkpoint_00000004.pt" and "checkpoint_00000008.pt" in warnings[0]


@pytest.mark.filterwarnings("error")  # nothing but our own error: no torch warning before it
def test_refused_and_incomplete_checkpoints_say_why(tmp_path):
    code = tmp_path / "code.pt"
    with open(code, "wb") as f:
        pickle.dump({"format": ckpt.FORMAT, "x": Path("p")}, f)  # an object weights_only will not build
    with pytest.raises(UserError, match="holds more than weights") as info:
        ckpt.load_checkpoint(code)
    assert "\n" not in str(info.value)
    partial = tmp_path / "partial.pt"
    torch.save({"format": ckpt.FORMAT, "model": {}}, partial)
    with pytest.raises(UserError, match="lacks config, vocab"):
        ckpt.load_checkpoint(partial)


def test_prune_drops_superseded_off_grid_checkpoints_and_stale_temporaries(tmp_path):
    run = tmp_path / "run"
    for step in (4, 8, 10, 12):  # 10: saved when a signal stopped the run; 12 the first save after resuming
        ckpt.save_checkpoint(payload(), ckpt.step_checkpoint_path(run, step))
    checkpointing.prune_checkpoints(run, keep_last=5, superseded=10)
    assert [p.name for p in ckpt.list_step_checkpoints(run)] == ["checkpoint_00000004.pt", "checkpoint_00000008.pt",
                                                                  "checkpoint_00000012.pt"]
    ckpt.save_checkpoint(payload(), ckpt.step_checkpoint_path(run, 14))  # the end, off the grid: kept
    checkpointing.prune_checkpoints(run, keep_last=5, superseded=10)
    assert ckpt.list_step_checkpoints(run)[-1].name == "checkpoint_00000014.pt"
    stale = ckpt.checkpoint_dir(run) / ".checkpoint_00000016.pt.abc123.tmp"
    stale.write_bytes(b"half a checkpoint")
    assert checkpointing.remove_stale_temporaries(run) == [stale] and not stale.exists()


def test_averaging_fewer_checkpoints_than_asked_names_the_real_cause(tmp_path):
    """30 updates saved every 5 wrote 6 checkpoints: with train.average_last 10 (and keep_last 10, which pruned none)
    the warning says the run was too short for 10, not that keep_last kept only 6; when more were written than are
    left, it says they were deleted."""
    from rpr_mt.config import TrainConfig

    run = tmp_path / "run"
    for step in range(5, 31, 5):
        ckpt.save_checkpoint({**payload(step), "step": step, "vocab": {"size": 4, "fingerprint": "f"}},
                             ckpt.step_checkpoint_path(run, step))

    messages: list[str] = []
    checkpointing.average_last(run, TrainConfig(save_every=5, keep_last=10, average_last=10), messages.append)
    assert messages[0] == (f"warning: train.average_last is 10 but {run} has only 6 numbered checkpoint(s): the run's "
                           "30 updates at train.save_every 5 wrote only 6; averaging 6")
    assert "keep_last" not in messages[0]
    assert ckpt.load_checkpoint(ckpt.checkpoint_dir(run) / "checkpoint_avg.pt")["averaged_steps"] == [5, 10, 15, 20,
                                                                                                     25, 30]
    messages.clear()
    checkpointing.average_last(run, TrainConfig(save_every=2, keep_last=10, average_last=10), messages.append)
    assert "has only 6 numbered checkpoint(s): the others were deleted" in messages[0]


def test_resume_survives_an_empty_config_and_another_spelling_of_the_path(tmp_path, demo_data, monkeypatch):  # noqa: F811
    run = tmp_path / "run"
    raw = tiny(demo_data, run, train={"max_steps": 8, "save_every": 4, "validate_every": 100})
    reference = tmp_path / "reference"
    train(config_from_dict(tiny(demo_data, reference, train={"max_steps": 8, "save_every": 4,
                                                             "validate_every": 100})), progress=False)
    first = config_from_dict({**raw, "train": {**raw["train"], "max_steps": 4}})
    train(first, progress=False)
    (run / "config.yaml").write_text("")  # a kill while config.yaml was being written (before it was atomic)
    (ckpt.checkpoint_dir(run) / ".checkpoint_00000008.pt.x.tmp").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    result = train(config_from_dict({**raw, "train": {**raw["train"], "run_dir": "./run/"}}), progress=False)
    assert result.step == 8 and not list(ckpt.checkpoint_dir(run).glob(".*.tmp"))
    for key, tensor in final_weights(reference).items():
        assert torch.equal(tensor, final_weights(run)[key]), key
    assert os.path.getsize(run / "config.yaml") > 0


@pytest.mark.parametrize("fault", ["checkpoint_write:2", "config_write:1", "config_write:2"])
def test_killed_during_a_write_then_resumed_ends_as_an_uninterrupted_run(tmp_path, demo_data, fault):  # noqa: F811
    """SIGKILL at a fault point (a checkpoint's bytes written but not renamed; config.yaml's temporary written but
    not renamed, on the first start or on a resume), then the same command again: the final model equals an
    uninterrupted run's, and no temporary file is left."""
    import subprocess
    import sys

    from rpr_mt.config import save_config

    sections = {"train": {"max_steps": 12, "save_every": 4, "validate_every": 100}}
    reference = tmp_path / "reference"
    train(config_from_dict(tiny(demo_data, reference, **sections)), progress=False)
    run = tmp_path / "run"
    config = tmp_path / "run.yaml"
    save_config(config_from_dict(tiny(demo_data, run, **sections)), config)
    command = [sys.executable, "-m", "rpr_mt.cli", "train", "--config", str(config), "--no-progress"]
    env = {**os.environ, "RPR_MT_KILL_AT": fault}
    if fault == "config_write:2":  # a first, finished part of the run; the kill then hits the resume's config write
        part = subprocess.run(command + ["--set", "train.max_steps=8"], capture_output=True, text=True)
        assert part.returncode == 0, part.stderr
        env["RPR_MT_KILL_AT"] = "config_write:1"
    killed = subprocess.run(command, env=env, capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    finished = subprocess.run(command, capture_output=True, text=True)
    assert finished.returncode == 0, finished.stderr
    for key, tensor in final_weights(reference).items():
        assert torch.equal(tensor, final_weights(run)[key]), key
    assert not list(run.rglob(".*.tmp"))


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGHUP"])
def test_a_run_stopped_off_the_save_grid_averages_and_keeps_what_an_uninterrupted_run_does(
    tmp_path, demo_data, monkeypatch, request, signal_name  # noqa: F811
):
    """SIGTERM (what `kill` or a cluster's pre-emption sends) or SIGHUP (a closed terminal) after update 6 (saves
    are every 4): the run saves checkpoint 6 and stops; resumed to the end, the kept checkpoints and
    checkpoint_avg.pt (the last 3 averaged) equal an uninterrupted run's, bit for bit."""
    import signal

    if not hasattr(signal, signal_name):
        pytest.skip(f"no {signal_name} on this platform")

    sections = {"train": {"max_steps": 12, "save_every": 4, "keep_last": 3, "average_last": 3,
                          "validate_every": 100}}
    reference = tmp_path / "reference"
    train(config_from_dict(tiny(demo_data, reference, **sections)), progress=False)

    run = tmp_path / "run"
    cfg = config_from_dict(tiny(demo_data, run, **sections))
    real_step, updates = torch.optim.Adam.step, []
    # under nohup SIGHUP arrives ignored, and training keeps it so: the test asks what a terminal's hang-up does
    previous = signal.signal(getattr(signal, signal_name), signal.SIG_DFL)
    request.addfinalizer(lambda: signal.signal(getattr(signal, signal_name), previous))

    def step_then_signal(self, *args, **kwargs):
        out = real_step(self, *args, **kwargs)
        updates.append(1)
        if len(updates) == 6:
            os.kill(os.getpid(), getattr(signal, signal_name))
        return out

    with monkeypatch.context() as patch:
        patch.setattr(torch.optim.Adam, "step", step_then_signal)
        stopped = train(cfg, progress=False)
    assert stopped.step == 6 and stopped.stopped_by == "signal"
    assert ckpt.list_step_checkpoints(run)[-1].name == "checkpoint_00000006.pt"
    resumed = train(cfg, progress=False)
    assert resumed.step == 12

    names = [p.name for p in ckpt.list_step_checkpoints(run)]
    assert names == [p.name for p in ckpt.list_step_checkpoints(reference)] == [
        "checkpoint_00000004.pt", "checkpoint_00000008.pt", "checkpoint_00000012.pt"]
    averaged, expected = (ckpt.load_checkpoint(ckpt.checkpoint_dir(r) / "checkpoint_avg.pt") for r in (run, reference))
    assert averaged["model"].keys() == expected["model"].keys()
    for key, tensor in expected["model"].items():
        assert torch.equal(tensor, averaged["model"][key]), key


def test_a_run_resumes_after_its_damaged_prepared_data_was_prepared_again(tmp_path, demo_data):  # noqa: F811
    """A truncated id array makes the prepared data stale, so train prepares it again; the same corpus must give the
    same SentencePiece file, or the run's checkpoints would be refused as 'trained with another vocabulary'."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(demo_data, data)
    raw = tiny(data, tmp_path / "run", train={"max_steps": 8, "save_every": 4, "validate_every": 100})
    train(config_from_dict({**raw, "train": {**raw["train"], "max_steps": 4}}), progress=False)
    fingerprint = (data / "spm.model").read_bytes()
    ids = data / "train.src.ids.npy"
    size = ids.stat().st_size
    ids.write_bytes(ids.read_bytes()[:-64])
    result = train(config_from_dict(raw), progress=False)
    assert ids.stat().st_size == size  # prepared again
    assert result.step == 8 and (data / "spm.model").read_bytes() == fingerprint
