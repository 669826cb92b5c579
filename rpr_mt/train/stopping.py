"""The stopping rules of a run (train.max_steps, max_epochs, max_time, patience), and what they say in words."""

from __future__ import annotations

from rpr_mt.config import TrainConfig
from rpr_mt.train.context import Session
from rpr_mt.train.state import TrainState


def stop_reason(session: Session, state: TrainState, epoch_done: bool = False) -> str:
    """The stopping rule that ends the run before another update ("" while none does); the same on every rank.
    ``epoch_done``: the current epoch's last batch has been trained (``state.epoch`` counts up only when the next
    epoch's first batch is drawn, so without it max_epochs would train one update of the next epoch)."""
    t = session.t
    if t.max_steps is not None and state.step >= t.max_steps:
        return "max_steps"
    if t.max_epochs is not None and state.epoch + int(epoch_done) >= t.max_epochs:
        return "max_epochs"
    if t.max_time is not None and session.dd.all_true(state.elapsed() >= t.max_time, session.device):
        return "max_time"
    if t.patience is not None and state.bad_validations >= t.patience:
        return "patience"
    return ""


def unfinished_target(t: TrainConfig, state: TrainState, epoch_done: bool = False) -> str:
    """Where an unfinished run trains to, in words: its stopping rules that end a run by themselves."""
    targets = []
    if t.max_steps is not None:
        targets.append(f"to update {t.max_steps} (now at {state.step})")
    if t.max_epochs is not None:
        targets.append(f"for {t.max_epochs} epoch(s) ({state.epoch + int(epoch_done)} done)")
    if t.max_time is not None:
        targets.append(f"for {t.max_time:g}s (it has trained {state.elapsed_before:.0f}s)")
    return "it trains " + " or ".join(targets)  # Config.validate requires one of them


def finished_because(reason: str, t: TrainConfig, state: TrainState, epoch_done: bool = False) -> str:
    """Why a resumed run has nothing left to train, in words (``reason`` from ``stop_reason``)."""
    if reason == "max_steps":
        return f"it is at update {state.step}, and train.max_steps is {t.max_steps}"
    if reason == "max_epochs":
        return f"it has trained {state.epoch + int(epoch_done)} epoch(s), and train.max_epochs is {t.max_epochs}"
    if reason == "max_time":
        return f"it has trained {state.elapsed_before:.0f}s, and train.max_time is {t.max_time:g}s"
    return f"its last {state.bad_validations} validations did not improve, and train.patience is {t.patience}"
