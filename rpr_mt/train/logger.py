"""What a run reports: a tqdm bar on a terminal (plain lines otherwise), metrics.jsonl and TensorBoard scalars."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

from rpr_mt.progress import show_progress
from rpr_mt.faults import fault_point
from rpr_mt.train.checkpointing import failed_write


def tensorboard_tag(key: str) -> str:
    """The TensorBoard name of a metrics.jsonl key: dev_bleu -> dev/bleu, best_dev_bleu -> dev/best_bleu,
    loss -> train/loss (two groups, so that TensorBoard shows training and validation curves apart)."""
    if key.startswith("dev_"):
        return "dev/" + key[4:]
    if key.startswith("best_dev_"):
        return "dev/best_" + key[9:]
    return "train/" + key


def end_cut_off_record(path: Path, say: Callable[[str], None]) -> None:
    """Drop a cut-off last line of ``path`` (a run killed while writing it), so that the records appended on resume
    start on a line of their own instead of continuing it (which the readers would refuse as corruption)."""
    if not path.is_file():
        return
    with open(path, "rb+") as handle:
        data = handle.read()
        if not data or data.endswith(b"\n"):
            return
        keep = data.rfind(b"\n") + 1
        handle.truncate(keep)
    say(f"{path}: dropped its cut-off last line ({len(data) - keep} bytes) before appending")


def drop_records_after(path: Path, step: int, say: Callable[[str], None]) -> None:
    """Drop the records of updates after ``step`` from ``path``: a run resumed from its checkpoint at ``step`` redoes
    them, so the file holds each update once (a killed invocation's copies beside the new ones would read as two
    runs' worth to jq or pandas). Rewritten whole, then renamed over it, as TensorBoard's purge_step does for the
    events."""
    if not path.is_file():
        return
    lines = path.read_bytes().splitlines(keepends=True)  # bytes: a damaged line is kept as it is, not a traceback
    kept = [line for line in lines if _step_of(line) <= step]
    if len(kept) == len(lines):
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(b"".join(kept))
    tmp.replace(path)
    say(f"{path}: dropped {len(lines) - len(kept)} record(s) of updates after {step}, which this resume trains again")


def _step_of(line: bytes) -> float:
    """A record's update (a line that is not a record with one is kept: -inf)."""
    try:
        value = json.loads(line).get("step")
    except (ValueError, AttributeError):  # (UnicodeDecodeError is a ValueError)
        return float("-inf")
    return value if isinstance(value, (int, float)) else float("-inf")


class Logger:
    """tqdm bar on a terminal, plain lines otherwise; metrics.jsonl; TensorBoard scalars. Rank 0 only."""

    def __init__(self, run_dir: Path, enabled: bool, progress: bool | None, total: int | None, initial: int,
                 tensorboard: bool = True) -> None:
        self.enabled = enabled
        self.metrics_path = run_dir / "metrics.jsonl"
        self.bar = None
        self.tensorboard = None
        if not enabled:
            return
        end_cut_off_record(self.metrics_path, self.message)
        drop_records_after(self.metrics_path, initial, self.message)
        use_bar = show_progress(progress)
        if use_bar:
            from tqdm import tqdm

            # With a total (train.max_steps) tqdm shows the estimated time left; a max_time-only run has none.
            self.bar = tqdm(total=total, initial=initial, unit="upd", dynamic_ncols=True, file=sys.stderr)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # a dependency of the package, so only a broken install gets here
                self.message("warning: no TensorBoard logs: the tensorboard package is missing "
                             "(pip install tensorboard, or set train.tensorboard=false)")
            else:
                # A resumed run redoes the updates after its checkpoint: purge_step hides the killed invocation's
                # events from there on, so each curve shows every update once (drop_records_after: metrics.jsonl)
                self.tensorboard = SummaryWriter(str(run_dir / "tensorboard"), purge_step=initial + 1)

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def record(self, record: dict[str, Any], line: str | None = None) -> None:
        if not self.enabled:
            return
        try:
            with open(self.metrics_path, "a", encoding="utf-8") as handle:
                fault_point("metrics_write")
                handle.write(json.dumps(record) + "\n")
        except OSError as exc:  # a full disk: one line, as for a checkpoint (a cut-off record is dropped on resume)
            self.close_bar()
            raise failed_write(self.metrics_path, exc, self.metrics_path.parent, record["step"]) from None
        if self.tensorboard is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("step", "epoch"):
                    self.tensorboard.add_scalar(tensorboard_tag(key), value, record["step"])
        if line is not None:
            if self.bar is None:
                self.message(line)

    def advance(self, step: int, postfix: dict[str, Any] | None = None) -> None:
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(step - self.bar.n)  # update(), not n = step: tqdm's rate and time left come from it

    def close_bar(self) -> None:
        """Close the bar (before a message that ends the run); later messages are plain lines."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def close(self) -> None:
        """Close the bar and the TensorBoard writer; later messages are plain lines."""
        self.close_bar()
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
