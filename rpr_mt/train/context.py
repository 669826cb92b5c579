"""One ``rpr-mt train`` invocation in this process: its config, its command-line options, this process's place among
the ranks and its device (``Session``), and the prepared data it trains on (``RunData``).

The set-up steps (``resume``, ``run_data``, ``init_from``), the stopping rules and the checkpoints take these small
objects instead of their fields one by one; ``trainer.Trainer`` owns them with the model, optimizer and run state.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rpr_mt.config import Config, TrainConfig
from rpr_mt.data.vocab import Vocab
from rpr_mt.device import device_type
from rpr_mt.errors import UserError
from rpr_mt.host import keep_freed_memory
from rpr_mt.train.device import cpu_bf16_warning, oversubscribed_threads_warning, pick_device
from rpr_mt.train.distributed import Distributed, init_distributed


@dataclass(frozen=True)
class TrainOptions:
    """The options of ``rpr-mt train`` beside its config (``trainer.train``'s keyword arguments)."""

    overwrite: bool = False  # delete the run in train.run_dir and start it over
    dry_run: bool = False  # print the model and the tokens per update; read and write nothing
    progress: bool | None = None  # a progress bar (None: on a terminal)
    more_steps: int | None = None  # continue a finished run for exactly this many more updates
    extend_hint: bool = True  # a finished run's message says how the CLI trains it longer

    def check(self, run_dir: str) -> None:
        """Refuse the combinations that no run allows, before anything is read or deleted."""
        if self.more_steps is not None and self.more_steps < 1:
            raise UserError(f"--more-steps must be >= 1 (got {self.more_steps})")
        if self.more_steps is not None and self.overwrite:
            raise UserError(f"--more-steps continues the run in {run_dir} and --overwrite deletes it: pass one or "
                            "the other")


@dataclass(frozen=True)
class Session:
    """This process's part in one invocation: the config (``train`` as ``--more-steps`` extends it), the options,
    the ranks, the device and the ``time.monotonic()`` at which the invocation began."""

    cfg: Config
    options: TrainOptions
    dd: Distributed
    device: torch.device
    started: float = field(default_factory=time.monotonic)

    @property
    def t(self) -> TrainConfig:
        return self.cfg.train

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.train.run_dir)

    def log(self, text: str) -> None:
        """A line on stderr, from rank 0 only (the set-up's report; the loop reports through its ``Logger``)."""
        self.dd.log(text)

    def with_train(self, **changes: Any) -> "Session":
        """This session with ``train`` settings replaced (``--more-steps`` lifts the stopping rules)."""
        train = dataclasses.replace(self.t, **changes)
        return dataclasses.replace(self, cfg=dataclasses.replace(self.cfg, train=train))

    def warn_about_the_device(self) -> None:
        """Say what makes this device slow for this run: bf16 without CPU support, more threads than cores."""
        for warning in (cpu_bf16_warning(self.device, self.t.precision),
                        oversubscribed_threads_warning(self.device, self.t.num_threads, self.dd.world)):
            if warning is not None:
                self.log(f"warning: {warning}")


def start_session(cfg: Config, options: TrainOptions, started: float) -> Session:
    """Set the thread count, join the ranks (under torchrun) and pick this rank's device."""
    t = cfg.train
    if t.num_threads is not None:
        torch.set_num_threads(t.num_threads)
    kind = device_type(t.device)
    if t.precision == "fp16" and kind != "cuda":
        raise UserError("train.precision 'fp16' needs CUDA; use 'bf16' on CPU")
    dd = init_distributed(kind)
    device = pick_device(cfg, dd)
    if device.type == "cpu":
        keep_freed_memory()  # freshly mapped tensors fault in page by page at every step (see rpr_mt.host)
    return Session(cfg, options, dd, device, started)


@dataclass(frozen=True)
class RunData:
    """The prepared data a run trains on (``run_data.load_run_data``)."""

    directory: Path  # data.output_dir
    vocab: Vocab
    train: Any  # the training pairs (``rpr_mt.data.binarize.load_split``)
    dev: Any | None  # the dev pairs; None without a dev split (nothing is validated)
    train_indices: np.ndarray  # the training pairs within the length limits, in file order
    vocab_payload: dict[str, Any]  # what a checkpoint records of the vocabulary (``checkpoints.vocab_payload``)
    fingerprint: str | None  # of the training pairs (``data.prepare.training_data_fingerprint``)
