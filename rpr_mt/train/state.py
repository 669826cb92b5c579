"""The state of a training run, as one object that writes and reads its own checkpoint payload (Sockeye's
``TrainState``).

A checkpoint holds the run state below, the model, optimizer and grad-scaler states, the RNG states, the config and
the vocabulary fingerprint. ``TrainState.payload`` builds that dictionary and ``TrainState.restore`` reads it back;
nothing else in the trainer names a payload key. The keys on disk are those of every earlier rpr-mt checkpoint
(``rpr-mt-checkpoint/1``, listed in ``PAYLOAD_KEYS``); entries added later (``target_tokens``, ``schedule_origin``,
``bad_validations``, ``best_loss``, ``dev``, ``train_data``) default as an old checkpoint needs. The checksum over all tensors is
added by ``rpr_mt.checkpoint_files.save_checkpoint`` and verified by ``load_checkpoint``.

Only the torch (and CUDA) generators are saved: dropout draws from them, while the data order is a function of the
seed and the epoch (``batching.make_batches``) and nothing in training draws from Python's or NumPy's global RNG.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from rpr_mt import checkpoint_files as ckpt

__all__ = ["PAYLOAD_KEYS", "TrainState"]

# Every key a training checkpoint holds (besides the ``checksum`` that save_checkpoint adds). Renaming one breaks
# the resumption of existing runs: read the old name in ``restore`` instead.
PAYLOAD_KEYS = (
    "format", "step", "epoch", "position", "elapsed", "target_tokens", "schedule_origin", "config", "vocab", "model",
    "optimizer", "scaler", "rng", "best_bleu", "best_loss", "bad_validations", "dev", "train_data",
)


@dataclass
class TrainState:
    """Where a run is. The totals are kept in two parts: ``elapsed_before`` and ``tokens_before`` count the
    invocations before this one (read from the checkpoint it resumed from), ``started`` and ``tokens`` this
    invocation; a payload writes their sums."""

    step: int = 0  # updates done
    epoch: int = 0  # 0-based epoch of the next batch
    position: int = 0  # batches of that epoch already used (the data order is a function of seed and epoch)
    elapsed_before: float = 0.0  # seconds of training in earlier invocations
    tokens_before: int | None = 0  # target tokens of earlier invocations (None: a checkpoint predates the count)
    schedule_origin: float | None = None  # elapsed seconds at the first update: the ``budget`` schedule's zero
    best_bleu: float | None = None  # best dev BLEU so far (None: not measured)
    # dev NLL of the best validation (checkpoint_best.pt's): what ``best`` means when BLEU is off, and what decides
    # between two validations of the same BLEU
    best_loss: float = math.inf
    bad_validations: int = 0  # validations since the last improvement (``train.patience``)
    dev: dict[str, Any] | None = None  # the latest validation's scores and update
    tokens: int = 0  # target tokens of this invocation (all ranks)
    started: float = field(default_factory=time.monotonic, compare=False)  # time.monotonic() when it began

    # -- totals -------------------------------------------------------------------------------------------------------

    def elapsed(self) -> float:
        """The run's training seconds so far, all invocations."""
        return self.elapsed_before + (time.monotonic() - self.started)

    def run_tokens(self) -> int | None:
        """The run's target tokens so far, all invocations (None when a checkpoint predates the count)."""
        return None if self.tokens_before is None else self.tokens_before + self.tokens

    def budget_progress(self, max_time: float | None) -> float:
        """Used share of the time budget, counted from the first update so that set-up time (data preparation,
        model building) shortens the schedule instead of eating its warm-up."""
        if max_time is None:
            return 0.0
        if self.schedule_origin is None:
            self.schedule_origin = self.elapsed()
        return (self.elapsed() - self.schedule_origin) / max(max_time - self.schedule_origin, 1e-9)

    # -- validation ---------------------------------------------------------------------------------------------------

    def add_validation(self, dev: dict[str, Any]) -> bool:
        """Take a validation's scores (``step``, ``nll``, ``bleu`` or None, ...): the best scores and the patience
        count follow them. True when they improve on the best: a higher dev BLEU, or the same dev BLEU at a lower dev
        NLL (a small model's BLEU stays at 0.00 for many validations while its loss falls); by dev NLL alone when BLEU
        is off."""
        bleu, nll = dev["bleu"], dev["nll"]
        if bleu is None:
            improved = nll < self.best_loss
        else:
            improved = (self.best_bleu is None or bleu > self.best_bleu
                        or (bleu == self.best_bleu and nll < self.best_loss))
        if improved:
            self.best_bleu = bleu if bleu is not None else self.best_bleu
            self.best_loss = nll  # the best validation's, which a tie in BLEU is compared with (not the lowest seen)
            self.bad_validations = 0
        else:
            self.bad_validations += 1
        self.dev = dev
        return improved

    # -- checkpoint payload -------------------------------------------------------------------------------------------

    def payload(
        self,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler,
        device: torch.device,
        config: dict[str, Any],
        vocab: dict[str, Any],
        train_data: str | None = None,
    ) -> dict[str, Any]:
        """The checkpoint payload of this state, with the run's totals so far. ``train_data``: the fingerprint of
        the prepared training pairs (``rpr_mt.data.prepare.training_data_fingerprint``)."""
        return {
            "format": ckpt.FORMAT,
            "step": self.step,
            "epoch": self.epoch,
            "position": self.position,
            "elapsed": self.elapsed(),
            "target_tokens": self.run_tokens(),
            "schedule_origin": self.schedule_origin,
            "config": config,
            "vocab": vocab,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict() if scaler.is_enabled() else None,
            "rng": {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            },
            "best_bleu": self.best_bleu,
            "best_loss": self.best_loss,
            "bad_validations": self.bad_validations,
            # the dev scores of these very weights, when they were validated (what `rpr-mt translate` reports)
            "dev": self.dev if self.dev is not None and self.dev["step"] == self.step else None,
            "train_data": train_data,
        }

    @classmethod
    def restore(
        cls,
        payload: dict[str, Any],
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler,
        device: torch.device,
        started: float | None = None,
    ) -> "TrainState":
        """Load the weights, optimizer, scaler and RNG states of ``payload`` in place and return its run state, as
        of an invocation that began at ``started`` (``time.monotonic()``; default now)."""
        model.load_state_dict(payload["model"])
        optimizer.load_state_dict(payload["optimizer"])
        if payload.get("scaler"):
            scaler.load_state_dict(payload["scaler"])
        torch.set_rng_state(payload["rng"]["torch"])
        if device.type == "cuda" and payload["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state(payload["rng"]["cuda"], device)
        return cls(
            step=payload["step"],
            epoch=payload["epoch"],
            position=payload["position"],
            elapsed_before=payload["elapsed"],
            tokens_before=payload.get("target_tokens"),
            schedule_origin=payload.get("schedule_origin"),
            best_bleu=payload.get("best_bleu"),
            # (checkpoints from before the BLEU tie-break hold the lowest NLL of the improving validations: a tie
            # must then beat that, which can only be stricter)
            best_loss=payload.get("best_loss", math.inf),
            bad_validations=payload.get("bad_validations", 0),
            dev=payload.get("dev"),
            started=time.monotonic() if started is None else started,
        )
