"""A one-time warning when training becomes far slower than it was at the start of the same run.

A CPU run that shares its cores with another busy process can slow down many times over without any error (intra-op
threads wait for a core that someone else holds; docs/benchmarks.md has the figures). A run with a
fixed number of updates then just takes longer, but a run with a wall-clock budget (``train.max_time``) ends after
far fewer updates, at a much worse BLEU, and exits 0: the run says so. The trainer feeds every log window's tokens/s
to a ``ThroughputMonitor``, which compares it with the run's own early rate, so the warning needs no
machine-specific number.
"""

from __future__ import annotations

import os
import statistics

__all__ = ["ThroughputMonitor", "slowdown_warning"]


class ThroughputMonitor:
    """Tells, once, when the tokens/s of log windows fall below ``threshold`` x the run's early rate.

    The early rate is the median of the first ``early_windows`` windows given to ``observe`` (the median, so that one
    noisy window does not set it). A slowdown must last ``patience`` windows in a row, so that a single slow window
    (a garbage-collection pause, a burst of disk writes) does not count.
    """

    def __init__(self, threshold: float = 0.5, early_windows: int = 3, patience: int = 2) -> None:
        if not 0.0 < threshold < 1.0 or early_windows < 1 or patience < 1:
            raise ValueError("threshold must be in (0, 1); early_windows and patience must be >= 1")
        self.threshold = threshold
        self.early_windows = early_windows
        self.patience = patience
        self.reference: float | None = None
        self.warned = False
        self._early: list[float] = []
        self._slow_in_a_row = 0

    def observe(self, rate: float) -> float | None:
        """Record one window's rate; returns the early (reference) rate the first time a slowdown is confirmed."""
        if self.warned:
            return None
        if self.reference is None:
            self._early.append(rate)
            if len(self._early) == self.early_windows:
                self.reference = statistics.median(self._early)
            return None
        if rate < self.threshold * self.reference:
            self._slow_in_a_row += 1
            if self._slow_in_a_row >= self.patience:
                self.warned = True
                return self.reference
        else:
            self._slow_in_a_row = 0
        return None


def slowdown_warning(rate: float, reference: float, step: int, device_type: str, threads: int) -> str:
    """The warning text, with the advice that fits the device."""
    text = (f"warning: training slowed to {rate:,.0f} target tokens/s at update {step}, "
            f"{rate / reference:.0%} of this run's early {reference:,.0f}")
    if device_type != "cpu":
        return text + "; is another job using this device?"
    advice = ("set train.num_threads=1 (one thread loses less to a busy core)" if threads > 1
              else "stop the other CPU-bound work")
    if os.environ.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE":  # `rpr-mt` sets it unless the user chose another
        advice += ", or start the run with OMP_WAIT_POLICY=PASSIVE"
    return (text + f"; another process is probably using the CPU cores ({threads} intra-op thread(s) here): "
            f"{advice} (see docs/benchmarks.md)")
