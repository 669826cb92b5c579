"""The run's reporter: a killed run's cut-off metrics record does not swallow the next one on resume."""

from __future__ import annotations

import json

from rpr_mt.curves import read_curves
from rpr_mt.train.logger import Logger


def test_resume_after_a_cut_off_record_starts_a_line_of_its_own(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    good = json.dumps({"step": 1, "loss": 5.0}) + "\n"
    path.write_text(good + '{"step": 2, "loss": 4.', encoding="utf-8")  # killed in the middle of a write
    logger = Logger(tmp_path, enabled=True, progress=False, total=None, initial=2, tensorboard=False)
    logger.record({"step": 2, "loss": 4.5})
    logger.close()
    assert path.read_text(encoding="utf-8") == good + json.dumps({"step": 2, "loss": 4.5}) + "\n"
    assert "dropped its cut-off last line (22 bytes)" in capsys.readouterr().err
    train, _ = read_curves(tmp_path)  # the reader takes every line (before the fix: corruption on line 2)
    assert [r["step"] for r in train] == [1, 2]


def test_a_complete_file_is_left_as_it_is(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "loss": 5.0}) + "\n", encoding="utf-8")
    Logger(tmp_path, enabled=True, progress=False, total=None, initial=1, tensorboard=False).close()
    assert path.read_text(encoding="utf-8") == json.dumps({"step": 1, "loss": 5.0}) + "\n"
    assert capsys.readouterr().err == ""


def test_tensorboard_after_a_resume_shows_each_update_once(tmp_path):
    """A run killed at update 4 after its checkpoint at 2 logged 3 and 4; resumed at 2 it logs them again. Without
    purge_step, TensorBoard drew both (a curve that runs back from 4 to 3)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    killed = Logger(tmp_path, enabled=True, progress=False, total=None, initial=0)
    for step in (1, 2, 3, 4):
        killed.record({"step": step, "loss": 10.0 - step})
    killed.close()
    resumed = Logger(tmp_path, enabled=True, progress=False, total=None, initial=2)
    for step in (3, 4, 5):
        resumed.record({"step": step, "loss": 1.0 - step / 10})
    resumed.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    points = [(e.step, round(e.value, 3)) for e in events.Scalars("train/loss")]
    assert points == [(1, 9.0), (2, 8.0), (3, 0.7), (4, 0.6), (5, 0.5)]


def test_a_full_disk_stops_the_run_in_one_line_naming_the_file_and_the_latest_checkpoint(tmp_path, monkeypatch):
    """A metrics.jsonl write that failed for want of space ended the run in a traceback; a checkpoint's said one
    line."""
    import errno

    import pytest

    from rpr_mt import checkpoint_files as ckpt
    from rpr_mt.errors import UserError
    from rpr_mt.train import logger as logger_module

    ckpt.checkpoint_dir(tmp_path).mkdir()
    ckpt.step_checkpoint_path(tmp_path, 4).write_bytes(b"")
    logger = Logger(tmp_path, enabled=True, progress=False, total=None, initial=4, tensorboard=False)

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(logger_module, "open", full_disk, raising=False)
    with pytest.raises(UserError, match=rf"^cannot write {tmp_path / 'metrics.jsonl'} \(No space left on device\); "
                                        r"the run stops at update 6: its latest checkpoint is .*checkpoint_00000004.pt "
                                        r"\(free some space, then run the same command to resume\)$"):
        logger.record({"step": 6, "loss": 4.5})


def test_a_resume_drops_the_records_of_the_updates_it_trains_again(tmp_path, capsys):
    """Killed at update 4 after its checkpoint at 2, the run logged 3 and 4; resumed at 2 it logs them again, and
    metrics.jsonl held both copies (jq and pandas read them as data)."""
    path = tmp_path / "metrics.jsonl"
    killed = Logger(tmp_path, enabled=True, progress=False, total=None, initial=0, tensorboard=False)
    for step in (1, 2, 3, 4):
        killed.record({"step": step, "loss": 10.0 - step})
    killed.record({"step": 4, "dev_bleu": 1.0})
    killed.close()
    resumed = Logger(tmp_path, enabled=True, progress=False, total=None, initial=2, tensorboard=False)
    for step in (3, 4, 5):
        resumed.record({"step": step, "loss": 1.0 - step / 10})
    resumed.close()
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [(r["step"], r["loss"]) for r in records] == [(1, 9.0), (2, 8.0), (3, 0.7), (4, 0.6), (5, 0.5)]
    assert "dropped 3 record(s) of updates after 2" in capsys.readouterr().err
    # a run started again from update 0 (killed before its first checkpoint) keeps none of the old records
    Logger(tmp_path, enabled=True, progress=False, total=None, initial=0, tensorboard=False).close()
    assert path.read_text(encoding="utf-8") == ""
