"""Learning-rate schedules: a pure function of the update number (and, for ``budget``, of the time spent)."""

from __future__ import annotations

import math

from rpr_mt.config import TrainConfig


def noam_lr(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """Vaswani et al. (2017), eq. 3, used by Shaw et al. (2018): scale * d^-0.5 * min(step^-0.5, step * warmup^-1.5)."""
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def inverse_sqrt_lr(step: int, peak_lr: float, warmup: int) -> float:
    """Linear warm-up to ``peak_lr`` over ``warmup`` updates, then peak_lr * sqrt(warmup / step) (fairseq)."""
    step = max(step, 1)
    return peak_lr * min(step / warmup, math.sqrt(warmup / step))


def budget_lr(progress: float, peak_lr: float, warmup_fraction: float, final_fraction: float) -> float:
    """A schedule that knows its budget: ``progress`` = elapsed / max_time (``budget``) or step / max_steps
    (``cosine``), in [0, 1].

    Linear warm-up over the first ``warmup_fraction`` of the budget, then cosine decay to
    ``final_fraction * peak_lr`` exactly when the budget ends, so a fixed-time run finishes annealed rather than
    mid-warm-up (the failure mode of a step-based schedule cut short by a clock). The step-based form gives the same
    shape with results that do not depend on the machine's speed, for sweeps.
    """
    progress = min(max(progress, 0.0), 1.0)
    if warmup_fraction > 0 and progress < warmup_fraction:
        return peak_lr * max(progress / warmup_fraction, 1e-3)
    decay = (progress - warmup_fraction) / max(1.0 - warmup_fraction, 1e-9)
    floor = final_fraction * peak_lr
    return floor + (peak_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * decay))


def learning_rate(cfg: TrainConfig, d_model: int, step: int, progress: float = 0.0) -> float:
    """The learning rate for update ``step`` (1-based); ``budget`` uses ``progress``, the used share of max_time."""
    if cfg.lr_schedule == "noam":
        return noam_lr(step, d_model, cfg.warmup_steps, cfg.lr_scale)
    if cfg.lr_schedule == "inverse_sqrt":
        return inverse_sqrt_lr(step, cfg.peak_lr, cfg.warmup_steps)
    if cfg.lr_schedule == "cosine":
        assert cfg.max_steps is not None  # validated on load
        return budget_lr((step - 1) / cfg.max_steps, cfg.peak_lr, cfg.warmup_fraction, cfg.final_lr_fraction)
    return budget_lr(progress, cfg.peak_lr, cfg.warmup_fraction, cfg.final_lr_fraction)
