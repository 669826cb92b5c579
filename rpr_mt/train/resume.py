"""Whether an invocation starts a run, resumes it, continues it (``--more-steps``) or refuses; from which checkpoint.

In order: ``claim_run_dir`` checks what the run will read and write, locks the run directory and refuses a run it
cannot resume before any data is prepared; ``start_state`` restores the checkpoint found (or fine-tunes, or starts at
update 0) once the data and model exist; ``plan`` decides, by the config's stopping rules, whether the run is
finished, and extends it for ``--more-steps``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rpr_mt import checkpoint_files as ckpt
from rpr_mt.config import config_to_dict
from rpr_mt.data.prepare import changed_since_prepared, dev_changed_since_prepared, settings_changed_since_prepared
from rpr_mt.errors import UserError
from rpr_mt.model.transformer import Seq2Seq
from rpr_mt.train.checkpointing import latest_valid_checkpoint, remove_stale_temporaries
from rpr_mt.train.context import RunData, Session
from rpr_mt.train.init_from import init_from
from rpr_mt.train.run_dir import RunDirLock, check_run_dir, config_differences, dev_measure_changes, \
    remove_previous_run, saved_config
from rpr_mt.train.state import TrainState
from rpr_mt.train.stopping import stop_reason, unfinished_target


@dataclass(frozen=True)
class Claim:
    """What the run directory holds, as ``claim_run_dir`` found it."""

    has_run: bool  # a config.yaml or numbered checkpoints (what --overwrite deletes)
    found: tuple[Path, dict[str, Any]] | None  # the newest checkpoint that loads, and its payload (None: start)

    def interrupted_at(self, finished: str) -> int | None:
        """The update of the checkpoint resumed from when a signal stopped its run off the save grid: superseded
        once this run saves past it. A finished run's last checkpoint (max_steps, max_time or patience off the
        grid), continued by --more-steps or a raised limit, is a result the user may have reported, and stays. A
        checkpoint says why its run ended (``stopped_by``); one without that counts as interrupted unless this
        config's rules find the run ``finished``."""
        if self.found is None:
            return None
        payload = self.found[1]
        stopped_by = payload.get("stopped_by")
        if not (stopped_by == "signal" if stopped_by is not None else not finished):
            return None
        step = payload.get("step")
        every = payload.get("config", {}).get("train", {}).get("save_every")
        return step if isinstance(step, int) and isinstance(every, int) and every > 0 and step % every else None


def claim_run_dir(session: Session, held: contextlib.ExitStack) -> Claim:
    """Check, before any work, what the run will read and write; lock the run directory for as long as ``held``
    holds it (one training at a time); refuse on every rank a run this config cannot resume; find the checkpoint to
    resume from, before the data is prepared: when every one is corrupt, starting from update 0 would replace them
    (and the best one) with a new run's, which is --overwrite's to decide."""
    run_dir, t, dd, options = session.run_dir, session.t, session.dd, session.options
    check_run_dir(run_dir, t.tensorboard, Path(session.cfg.data.output_dir))
    has_checkpoints = bool(ckpt.list_step_checkpoints(run_dir))  # until --overwrite removes them
    _check_more_steps(session, has_checkpoints)
    # a resumed run no longer reads it; under --overwrite it is read after the old run is gone: checked before
    if t.init_from is not None and (options.overwrite or not has_checkpoints):
        try:
            ckpt.resolve_checkpoint(t.init_from, "best")
        except UserError as exc:
            raise UserError(f"train.init_from: {exc}") from None
    busy = dd.is_main and not held.enter_context(RunDirLock(run_dir, warn=session.log)).acquired
    if not dd.all_true(not busy, session.device):
        raise UserError(f"another `rpr-mt train` is training in {run_dir} (it holds {run_dir / RunDirLock.NAME}); "
                        "wait for it to finish, or choose another train.run_dir")
    if dd.is_main:
        for stale in remove_stale_temporaries(run_dir):
            session.log(f"removed {stale.name}, left by a checkpoint write that was interrupted")
    has_run = (run_dir / "config.yaml").is_file() or has_checkpoints
    refusal = _refusal(session, has_checkpoints) if dd.is_main and has_run else ""
    if not dd.all_true(not refusal, session.device):  # every rank stops, not rank 0 alone (the others would wait)
        raise UserError(refusal or f"{run_dir} holds a run that this config cannot resume (rank 0 says why)")
    dd.barrier()
    found = None if options.overwrite else latest_valid_checkpoint(run_dir, warn=session.log)
    if found is None and not options.overwrite and ckpt.list_step_checkpoints(run_dir):
        raise UserError(f"no checkpoint in {ckpt.checkpoint_dir(run_dir)} loads (each is named above), so {run_dir} "
                        "cannot be resumed; restore one, or pass --overwrite to delete the run and start it over")
    return Claim(has_run, found)


def _check_more_steps(session: Session, has_checkpoints: bool) -> None:
    """--more-steps continues a checkpoint of a step-based schedule."""
    if session.options.more_steps is None:
        return
    if not has_checkpoints:
        raise UserError(f"--more-steps: {session.run_dir} has no checkpoint to continue; train it first")
    if session.t.lr_schedule == "budget":
        raise UserError("--more-steps: the 'budget' schedule is a function of train.max_time; continue a "
                        "time-budget run with --set train.max_time=SECONDS (its new total) instead")


def _refusal(session: Session, has_checkpoints: bool) -> str:
    """Why rank 0 refuses to resume the run in the run directory with this config ("" when it does not), and the
    warnings of a run that resumes measuring its dev BLEU differently. Data whose inputs changed since the run's
    checkpoints were trained on it is refused before it is prepared again, which would replace the vocabulary they
    need; damaged files of unchanged inputs are prepared again (the same inputs give the same vocabulary)."""
    cfg, run_dir, overwrite = session.cfg, session.run_dir, session.options.overwrite
    config_path = run_dir / "config.yaml"
    changed = changed_since_prepared(cfg.data) if has_checkpoints else None
    old, new = saved_config(config_path, run_dir, session.log), config_to_dict(cfg)
    diffs = config_differences(old, new)
    if not overwrite and not diffs:
        _warn_of_dev_changes(session, old, new, check_dev_file=has_checkpoints and not changed)
    if diffs and not overwrite:
        settings = config_path if config_path.is_file() else "in its checkpoints"
        return (f"{run_dir} holds a run with a different config ({'; '.join(diffs[:3])}); to resume it, train with "
                f"its own settings ({settings}); to start another run, choose another train.run_dir, or pass "
                "--overwrite to delete that run (its checkpoints too)")
    if not changed or overwrite:
        return ""
    other_settings = settings_changed_since_prepared(cfg.data)
    if other_settings:
        # the run's config is unchanged, so another config prepared the shared directory since: this run's own
        # settings and inputs rebuild what its checkpoints were trained on (the vocabulary check confirms it)
        return (f"{cfg.data.output_dir} was prepared since with other data settings than this run's "
                f"({other_settings}), probably for another run sharing it. `rpr-mt prepare` with this run's config "
                f"rebuilds the data {run_dir} was trained on (the same inputs and settings give the same vocabulary) "
                "but replaces the other run's: give each its own data.output_dir")
    return (f"{run_dir} holds checkpoints trained on the data in {cfg.data.output_dir}, but its inputs changed since "
            f"({changed}): preparing it again could change the vocabulary they need. To resume, restore what "
            "changed; to start over on the new data, pass --overwrite (deletes the run's checkpoints) or choose "
            "another train.run_dir")


def _warn_of_dev_changes(session: Session, old: dict[str, Any], new: dict[str, Any], check_dev_file: bool) -> None:
    """A resumed run whose dev BLEU is measured another way (settings, or a corrected dev file, which is prepared
    again: the vocabulary is learnt from the training pairs alone) compares new validations with a best score
    measured the old way: said, not refused."""
    measure = dev_measure_changes(old, new) if old else []
    if measure:
        session.log(f"warning: the dev BLEU of {session.run_dir} is measured differently from now on "
                    f"({'; '.join(measure)}): its best checkpoint and patience compare new validations with a best "
                    "score measured the old way")
    dev_changed = dev_changed_since_prepared(session.cfg.data) if check_dev_file else None
    if dev_changed:
        session.log(f"warning: the dev set of {session.run_dir} changed since its last validation ({dev_changed}): "
                    "its best checkpoint and patience compare new validations with a best score measured on the old "
                    "set")


def start_state(session: Session, claim: Claim, data: RunData, *, model: Seq2Seq, optimizer: torch.optim.Optimizer,
                scaler: torch.amp.GradScaler) -> TrainState:
    """The run state this invocation starts from: the checkpoint found, restored into ``model``, ``optimizer`` and
    ``scaler``; or a new run (from train.init_from's weights when set). --overwrite deletes the previous run only
    here, once the data, model and optimizer are made and train.init_from's weights loaded: an input error leaves
    the old run as it was. It deletes a run of the same config too (one started over after a code fix, or one
    whose checkpoints broke)."""
    state = TrainState(started=session.started)
    if claim.found is not None:
        state = _restore(session, claim.found, data, model=model, optimizer=optimizer, scaler=scaler)
    elif session.t.init_from is not None:
        init_from(session, data, model, optimizer)
    if session.options.overwrite and session.dd.is_main and claim.has_run:
        session.log(f"--overwrite: removing the previous run in {session.run_dir}")
        remove_previous_run(session.run_dir)
    session.dd.barrier()
    return state


def _restore(session: Session, found: tuple[Path, dict[str, Any]], data: RunData, **parts: Any) -> TrainState:
    """The state of checkpoint ``found``, loaded into ``parts`` (model, optimizer, scaler), once its vocabulary and
    training pairs are those of ``data``."""
    path, payload = found
    if payload["vocab"]["fingerprint"] != data.vocab_payload["fingerprint"]:
        raise UserError(f"{path} was trained with another vocabulary than {data.directory / 'spm.model'}")
    # the same vocabulary, other pairs: `rpr-mt prepare` rebuilt the data from changed inputs since (the check of the
    # inputs compares them with the manifest, which that rebuild rewrote); checkpoints from before the fingerprint
    # have none
    if payload.get("train_data") not in (None, data.fingerprint):
        raise UserError(f"{path} was trained on other training pairs than {data.directory} holds now (prepared again "
                        "since from changed inputs?). To resume, restore the inputs and run `rpr-mt prepare --force` "
                        "with this run's config; to start over on this data, pass --overwrite (deletes the run's "
                        "checkpoints) or choose another train.run_dir")
    state = TrainState.restore(payload, device=session.device, started=session.started, **parts)
    session.log(f"resuming from {path} (update {state.step}, epoch {state.epoch + 1}, batch {state.position})")
    if session.t.init_from is not None:
        session.log(f"train.init_from is not used: {session.run_dir} already has checkpoints of its own")
    return state


def plan(session: Session, claim: Claim, state: TrainState, epoch_done: bool) -> tuple[Session, str]:
    """The session to train with and the stopping rule that already finishes the resumed run ("" for none), by the
    rules of this command's config (those in effect before --more-steps lifts them). A finished run is not trained
    again; --more-steps extends only a finished run: N more than an unfinished run's latest checkpoint would shorten
    the run and its step-based schedule."""
    finished = stop_reason(session, state, epoch_done) if claim.found is not None else ""
    more_steps = session.options.more_steps
    if more_steps is None:
        return session, finished
    if claim.found is None:  # every checkpoint is corrupt (each was named above)
        raise UserError(f"--more-steps: {session.run_dir} has no checkpoint to continue; train it first")
    if not finished:
        raise UserError(f"--more-steps: {session.run_dir} is not finished: "
                        f"{unfinished_target(session.t, state, epoch_done)}; run the same command without "
                        "--more-steps to resume it")
    session = session.with_train(max_steps=state.step + more_steps, max_epochs=None, max_time=None, patience=None)
    session.log(f"--more-steps {more_steps}: training to update {session.t.max_steps} (max_epochs, max_time and "
                "patience lifted)")
    return session, finished
