"""The state of a training run, as one object that writes and reads its own checkpoint payload (Sockeye's
``TrainState``).

A checkpoint holds the run state below, the model, optimizer and grad-scaler states, the RNG states, the config and
the vocabulary fingerprint. ``TrainState.payload`` builds that dictionary and ``TrainState.restore`` reads it back;
nothing else in the trainer names a payload key. The keys on disk are those of every earlier rpr-mt checkpoint
(``rpr-mt-checkpoint/1``); entries added later (``target_tokens``, ``schedule_origin``, ``bad_validations``,
``best_loss``) default as an old checkpoint needs. The checksum over all tensors is added by
``checkpoint.save_checkpoint`` and verified by ``checkpoint.load_checkpoint``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from rpr_mt.train import checkpoint as ckpt

__all__ = ["TrainState"]


@dataclass
class TrainState:
    """Where a run is. ``elapsed_before`` and ``tokens_before`` count the invocations before this one: the current
    invocation's own time and tokens are added when a payload is written."""

    step: int = 0  # updates done
    epoch: int = 0  # 0-based epoch of the next batch
    position: int = 0  # batches of that epoch already used (the data order is a function of seed and epoch)
    elapsed_before: float = 0.0  # seconds of training in earlier invocations
    tokens_before: int | None = 0  # target tokens of earlier invocations (None: a checkpoint predates the count)
    schedule_origin: float | None = None  # elapsed seconds at the first update: the ``budget`` schedule's zero
    best_bleu: float | None = None
    best_loss: float = math.inf
    bad_validations: int = 0  # validations since the last improvement (``train.patience``)
    dev: dict[str, Any] | None = field(default=None)  # the latest validation's scores and update

    def payload(
        self,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler,
        device: torch.device,
        config: dict[str, Any],
        vocab: dict[str, Any],
        elapsed: float,
        target_tokens: int | None,
        **changes: Any,
    ) -> dict[str, Any]:
        """The checkpoint payload of this state: ``elapsed`` and ``target_tokens`` are the run's totals so far;
        ``changes`` replace entries (the best checkpoint is written with its validation's own scores before the run's
        copies of them are updated)."""
        return {
            "format": ckpt.FORMAT,
            "step": self.step,
            "epoch": self.epoch,
            "position": self.position,
            "elapsed": elapsed,
            "target_tokens": target_tokens,
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
            **changes,
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
    ) -> "TrainState":
        """Load the weights, optimizer, scaler and RNG states of ``payload`` in place and return its run state."""
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
            best_loss=payload.get("best_loss", math.inf),
            bad_validations=payload.get("bad_validations", 0),
            dev=payload.get("dev"),
        )
