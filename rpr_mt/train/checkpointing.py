"""A run's numbered checkpoints: when they are written, which are kept, the newest one that loads, and their average.

The file format (writing, loading, verifying) is ``rpr_mt.checkpoint_files``; this module decides which files a training
run holds.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Callable

from rpr_mt.checkpoint_files import (
    STEP_PATTERN, average_checkpoints, averaged_steps, checkpoint_dir, list_step_checkpoints, load_checkpoint,
    save_checkpoint, step_checkpoint_path, write_failure,
)
from rpr_mt.config import TrainConfig
from rpr_mt.errors import UserError
from rpr_mt.train.context import Session
from rpr_mt.train.state import TrainState


def latest_valid_checkpoint(run_dir: str | Path, warn: Callable[[str], None] = print) -> tuple[Path, dict[str, Any]] | None:
    """The newest numbered checkpoint that loads; corrupt ones are reported by name and skipped."""
    for earlier, path in reversed(list(enumerate(list_step_checkpoints(run_dir)))):  # earlier: how many are older
        try:
            return path, load_checkpoint(path)
        except UserError as exc:
            then = "falling back to the previous checkpoint" if earlier else "no earlier checkpoint"
            warn(f"warning: {exc}; {then}")
    return None


def prune_checkpoints(run_dir: str | Path, keep_last: int, superseded: int | None = None) -> None:
    """Keep the newest ``keep_last`` numbered checkpoints. ``superseded``: the update of the checkpoint an
    interrupted run saved off its save grid when it was stopped (the one this run resumed from); once the resumed run
    has saved past it, it is dropped first, so an interrupted run keeps (and averages) the same checkpoints as an
    uninterrupted one. Only that one: checkpoints on an older grid (train.save_every changed on resume) stay."""
    paths = list_step_checkpoints(run_dir)
    if superseded is not None and paths and paths[-1] != step_checkpoint_path(run_dir, superseded):
        step_checkpoint_path(run_dir, superseded).unlink(missing_ok=True)
        paths = list_step_checkpoints(run_dir)
    for path in paths[:-keep_last]:
        path.unlink(missing_ok=True)


def remove_stale_temporaries(run_dir: str | Path) -> list[Path]:
    """Delete the temporary files of checkpoint writes that a kill interrupted (``.checkpoint_*.tmp``)."""
    directory = checkpoint_dir(run_dir)
    stale = sorted(directory.glob(".*.tmp")) if directory.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


class CheckpointSaver:
    """The run's checkpoint files, written by rank 0. ``payload`` gives the checkpoint of a run state (the trainer's
    ``TrainState.payload`` of its model, optimizer and grad scaler); ``interrupted_at``: the off-grid checkpoint this
    run resumed from, if any (``prune_checkpoints``); ``last`` is the numbered checkpoint this invocation saved last."""

    def __init__(self, session: Session, payload: Callable[[TrainState], dict[str, Any]],
                 interrupted_at: int | None = None) -> None:
        self.session, self.run_dir, self.payload = session, session.run_dir, payload
        self.interrupted_at = interrupted_at
        self.last: Path | None = None

    def save(self, state: TrainState, stopped_by: str = "") -> None:
        """checkpoint_<update>.pt, then prune to train.keep_last; every rank waits for it (and stops with it on a
        failed write). ``stopped_by``: the run's last checkpoint says why it ended (``signal``: interrupted, so that a
        resume drops it once past it; a finished run's stays, however it is continued)."""
        path = step_checkpoint_path(self.run_dir, state.step)

        def write_and_prune() -> None:
            self._write(state, path, stopped_by)
            prune_checkpoints(self.run_dir, self.session.t.keep_last, self.interrupted_at)

        self.session.dd.on_main(write_and_prune, self.session.device, f"write {path}")
        self.last = path

    def save_best(self, state: TrainState) -> None:
        """checkpoint_best.pt, after a validation that improved the best score (rank 0 only)."""
        self._write(state, checkpoint_dir(self.run_dir) / "checkpoint_best.pt")

    def _write(self, state: TrainState, path: Path, stopped_by: str = "") -> None:
        """A failed write (a full disk) stops the run with one line that says what it kept."""
        payload = self.payload(state)
        if stopped_by:
            payload["stopped_by"] = stopped_by
        try:
            save_checkpoint(payload, path)
        except UserError as exc:
            raise run_stops(str(exc), self.run_dir, state.step) from None


def run_stops(error: str, run_dir: Path, step: int) -> UserError:
    """The one line that stops a run whose file write failed (a full disk): ``error`` (what failed, and why), then
    the update it stops at and the checkpoint it will resume from."""
    kept = list_step_checkpoints(run_dir)
    resume = f"its latest checkpoint is {kept[-1]}" if kept else "it has no checkpoint yet"
    return UserError(f"{error}; the run stops at update {step}: {resume} (free some space, then run the same "
                     "command to resume)")


def failed_write(path: Path, exc: OSError, run_dir: Path, step: int) -> UserError:
    """``run_stops`` for an OSError writing ``path`` (metrics.jsonl, config.yaml), said as a checkpoint's is."""
    return run_stops(f"cannot write {path} ({write_failure(exc, path.parent)})", run_dir, step)


def average_is_current(run_dir: Path, t: TrainConfig) -> bool:
    """Whether checkpoint_avg.pt is already the mean of the last train.average_last numbered checkpoints (by their
    updates): what ``average_last`` would write again."""
    paths = list_step_checkpoints(run_dir)[-t.average_last:]
    steps = [int(STEP_PATTERN.search(path.name).group(1)) for path in paths]
    return bool(steps) and averaged_steps(checkpoint_dir(run_dir) / "checkpoint_avg.pt") == steps


def average_last(run_dir: Path, t: TrainConfig, say: Callable[[str], None]) -> None:
    """checkpoint_avg.pt: the mean of the last train.average_last numbered checkpoints (rank 0 only). Fewer are there
    when the run was too short for them (train.keep_last, which is at least average_last, pruned none of them).
    ``say``: where its lines go (the run's Logger.message)."""
    paths = list_step_checkpoints(run_dir)[-t.average_last:]
    if len(paths) < t.average_last:
        match = STEP_PATTERN.search(paths[-1].name) if paths else None
        updates = int(match.group(1)) if match else 0  # the run's last update: it saves a checkpoint there
        written = -(-updates // t.save_every)  # one every save_every updates, and one at the end off that grid
        if written < t.average_last:
            why = f"the run's {updates} updates at train.save_every {t.save_every} wrote only {written}"
        else:
            why = "the others were deleted (by hand, or by a smaller train.keep_last of an earlier invocation)"
        say(f"warning: train.average_last is {t.average_last} but {run_dir} has only {len(paths)} "
            f"numbered checkpoint(s): {why}; averaging {len(paths)}")
    save_checkpoint(average_checkpoints(paths), checkpoint_dir(run_dir) / "checkpoint_avg.pt")
    say(f"averaged {len(paths)} checkpoint{'s' if len(paths) > 1 else ''} into "
        f"{checkpoint_dir(run_dir) / 'checkpoint_avg.pt'}")




def checkpoint_to_use(run_dir: Path, t: TrainConfig, data_dir: Path, src_lang: str) -> str:
    """The end of a finished run's summary line: the checkpoint to use and the commands that use it. The average
    when train.average_last made one (the checkpoint a recipe's scores are of), else the best on dev (translate's
    and eval-bleu's default), else the last (no validation chose a best); eval-bleu scores the prepared test split
    (dev where there is no test)."""
    folder = checkpoint_dir(run_dir)
    if t.average_last > 0 and (folder / "checkpoint_avg.pt").is_file():
        path, which = folder / "checkpoint_avg.pt", " --which average"
        steps = averaged_steps(path) or []
        what = (f"the average of the checkpoints of updates {steps[0]}-{steps[-1]}" if len(steps) > 1
                else "the average of the last checkpoints")
    elif (folder / "checkpoint_best.pt").is_file():
        path, which, what = folder / "checkpoint_best.pt", "", "the best on dev"
    else:
        numbered = list_step_checkpoints(run_dir)
        if not numbered:
            return "no checkpoint written"
        path, which, what = numbered[-1], " --which last", "the last: no validation chose a best one"
    run = shlex.quote(str(run_dir))
    commands = [f"rpr-mt translate --checkpoint {run}{which} -i FILE"]
    split = next((name for name in ("test", "dev") if (data_dir / f"{name}.{src_lang}").is_file()), None)
    if split is not None:
        commands.insert(0, f"rpr-mt eval-bleu --checkpoint {run}{which} --split {split}")
    return f"use {path} ({what}): {', or '.join(commands)}"
