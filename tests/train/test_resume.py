"""rpr_mt/train/resume.py: which checkpoint a resumed run supersedes (the decisions around it run end to end in
test_trainer.py, test_run_control.py and test_integrity.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rpr_mt.train.resume import Claim


def claim(step: int, save_every: int | None = 4, stopped_by: str | None = None) -> Claim:
    payload = {"step": step, "config": {"train": {} if save_every is None else {"save_every": save_every}}}
    if stopped_by is not None:
        payload["stopped_by"] = stopped_by
    return Claim(has_run=True, found=(Path(f"checkpoint_{step:08d}.pt"), payload))


@pytest.mark.parametrize("found, finished, superseded", [
    (claim(6, stopped_by="signal"), "", 6),  # a signal stopped it off the save grid: dropped once saved past
    (claim(6, stopped_by="signal"), "max_steps", 6),  # however this config's rules see the run
    (claim(8, stopped_by="signal"), "", None),  # on the grid: an uninterrupted run keeps it too
    (claim(6, stopped_by="max_steps"), "", None),  # a finished run's last checkpoint is a result: it stays
    (claim(6), "", 6),  # from before stopped_by was recorded: interrupted unless finished
    (claim(6), "max_steps", None),
    (claim(6, save_every=None, stopped_by="signal"), "", None),  # no grid recorded: nothing to supersede
    (Claim(has_run=False, found=None), "", None),  # a new run
])
def test_only_an_interrupted_runs_off_grid_checkpoint_is_superseded(found, finished, superseded):
    assert found.interrupted_at(finished) == superseded
