"""One run's learning curves from its ``metrics.jsonl``, as an image (``rpr-mt plot RUN``; PNG by default).

The trainer appends a record per log line (loss, nll, lr, tgt_tok_s, ...) and per validation (dev_nll, dev_bleu).
An interrupted run that was resumed has logged the updates after its last checkpoint twice; the records of the
invocation that resumed replace them, so each curve shows the updates that made the final weights.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rpr_mt.errors import UserError
from rpr_mt.run_metrics import METRICS_FILE, read_records
from rpr_mt.plotting import pyplot  # matplotlib is an optional extra; pyplot() says how to install it

__all__ = ["read_curves", "plot_run"]


def _metrics_file(run: str | Path) -> Path:
    """The metrics file of ``run``: a run directory's ``metrics.jsonl``, or that file itself (a copy of it too),
    as `rpr-mt plot runs/x/metrics.jsonl` names it."""
    run = Path(run)
    return run if run.is_file() else run / METRICS_FILE


def read_curves(run_dir: str | Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training records, validation records) of ``run_dir`` (a run directory or its metrics.jsonl), each in update
    order with resumed updates once. A cut-off last line (a killed run) is skipped with a warning
    (``rpr_mt.run_metrics.read_records``)."""
    path = _metrics_file(run_dir)
    if not path.is_file():
        raise UserError(f"no metrics.jsonl in {run_dir} (is it a training run directory?)")
    train: list[dict[str, Any]] = []
    dev: list[dict[str, Any]] = []
    for record in read_records(path):
        step = int(record["step"])
        series = dev if "dev_nll" in record else train if "loss" in record else None
        if series is None:
            continue
        while series and series[-1]["step"] >= step:  # a resumed invocation redoes these updates
            series.pop()
        series.append(record)
    if not train and not dev:
        raise UserError(f"{path} has no training or validation records yet")
    return train, dev


def plot_run(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """Draw loss (train and dev), dev BLEU, learning rate and target tokens/s against the update; returns the
    image's path (any format matplotlib writes, by its suffix; default: curves.png beside the metrics file, in the
    run directory). ``run_dir``: a run directory or its metrics.jsonl. The tokens/s panel leaves out the first log
    window (start-up, not speed)."""
    given, run_dir = run_dir, _metrics_file(run_dir).parent
    output = Path(output) if output is not None else run_dir / "curves.png"
    plt = pyplot()
    from matplotlib.backend_bases import FigureCanvasBase

    image_format = output.suffix.lstrip(".").lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if image_format not in formats:  # before reading the run; matplotlib would refuse only after drawing
        raise UserError(f"--output {output}: the name must end in an image format matplotlib writes "
                        f"({', '.join('.' + f for f in sorted(formats))}), e.g. curves.png")
    train, dev = read_curves(given)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    (ax_loss, ax_bleu), (ax_lr, ax_speed) = axes

    def draw(ax, records: list[dict[str, Any]], key: str, label: str, **style: Any) -> bool:
        points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if points:
            ax.plot(*zip(*points), label=label, **style)
        return bool(points)

    draw(ax_loss, train, "loss", "train (label-smoothed)", linewidth=1)
    draw(ax_loss, train, "nll", "train NLL", linewidth=1)
    draw(ax_loss, dev, "dev_nll", "dev NLL", marker="o")
    ax_loss.set(ylabel="loss per target token", title="loss")
    ax_loss.legend()
    if not draw(ax_bleu, dev, "dev_bleu", "dev BLEU", marker="o"):
        ax_bleu.text(0.5, 0.5, "no dev BLEU recorded", ha="center", va="center", transform=ax_bleu.transAxes)
    ax_bleu.set(ylabel="sacreBLEU (validation decode)", title="dev BLEU")
    draw(ax_lr, train, "lr", "learning rate", linewidth=1)
    ax_lr.set(ylabel="learning rate", title="learning rate")
    # The first log window includes start-up (first allocations, warm-up): its rate would be a dip at the start of
    # the curve, not the training speed. The trainer's slowdown monitor leaves it out too.
    draw(ax_speed, train[1:], "tgt_tok_s", "target tokens/s", linewidth=1)
    ax_speed.set(ylabel="target tokens/s", title="training speed (per log window; first window left out)")
    for ax in axes.flat:
        ax.set_xlabel("update")
        ax.grid(alpha=0.3)
    fig.suptitle(str(run_dir))
    fig.tight_layout()
    # written whole, then renamed: a kill leaves no half image; a symlink's file is written and the link kept
    target = Path(os.path.realpath(output)) if output.is_symlink() else output
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        fig.savefig(tmp, dpi=100, format=image_format)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
        plt.close(fig)
    return output
