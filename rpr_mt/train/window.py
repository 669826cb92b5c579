"""The log window: sums over the updates since the last log line, the line itself, and the slowdown check."""

from __future__ import annotations

import time

import torch

from rpr_mt.train.device import peak_memory_mb
from rpr_mt.train.logger import Logger
from rpr_mt.train.state import TrainState
from rpr_mt.train.throughput import ThroughputMonitor, slowdown_warning


class LogWindow:
    """Sums over the updates since the last log line, and the log line itself."""

    def __init__(self, monitor: ThroughputMonitor) -> None:
        self.monitor = monitor
        self.first = True  # the first window includes start-up work (compilation, first allocations): not a rate
        self.reset()

    def reset(self) -> None:
        self.loss, self.nll, self.tgt, self.src, self.start = 0.0, 0.0, 0, 0, time.monotonic()
        self.updates = 0  # updates summed since the last log line

    def add(self, loss: float, nll: float, tgt: int, src: int) -> None:
        self.updates += 1
        self.loss += loss
        self.nll += nll
        self.tgt += tgt
        self.src += src

    def log(self, state: TrainState, lr: float, logger: Logger, device: torch.device, last: bool = False) -> None:
        """The line and record of the updates since the last one, at ``state.step``. ``last``: the run's last
        window, cut short by its end (off the log_every grid): its rate is not fed to the slowdown check, which
        could only warn as the run ends."""
        seconds = max(time.monotonic() - self.start, 1e-9)
        step = state.step
        record = {
            "step": step, "epoch": state.epoch + 1, "loss": self.loss / max(self.tgt, 1),
            "nll": self.nll / max(self.tgt, 1), "lr": lr, "tgt_tok_s": self.tgt / seconds,
            "src_tok_s": self.src / seconds, "elapsed": state.elapsed(), "peak_mem_mb": peak_memory_mb(device),
        }
        logger.record(record, (
            f"update {step} | epoch {state.epoch + 1} | loss {record['loss']:.3f} | lr {lr:.2e} | "
            f"{record['tgt_tok_s']:,.0f} tgt tok/s | {record['src_tok_s']:,.0f} src tok/s | "
            f"{record['elapsed']:.0f}s | peak {record['peak_mem_mb']:,.0f} MB"))
        logger.advance(step, {"loss": f"{record['loss']:.3f}", "lr": f"{lr:.1e}", "tok/s": f"{record['tgt_tok_s']:,.0f}"})
        if not self.first and not last and (reference := self.monitor.observe(record["tgt_tok_s"])) is not None:
            logger.message(slowdown_warning(record["tgt_tok_s"], reference, step, device.type, torch.get_num_threads()))
        self.first = False
        self.reset()
