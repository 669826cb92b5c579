"""Read a sweep's run directories and write tables shaped like Shaw et al. (2018), Tables 1-3, and plots.

Numbers are mean ± sample standard deviation over the seeds that have finished (``result.json``); the seed count is
printed with each row, so a half-finished sweep is visible as such. The paper's own numbers (WMT14, base model) are
printed beside ours for orientation only: our runs are small models on Multi30k, so only the direction and rough size
of each difference can be compared, not the values.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rpr_mt.curves import read_curves
from rpr_mt.errors import UserError
from rpr_mt.experiments.sweep import TABLE_NAMES, table_cells
from rpr_mt.plotting import pyplot

# Shaw et al. (2018). Table 1: newstest2014 BLEU of the base model, En-De / En-Fr. Tables 2 and 3: newstest2013
# (dev) BLEU of the En-De base model. docs/reproduction.md says which of these were checked against the paper.
PAPER = {
    ("positions", "absolute"): "26.5 / 38.2",
    ("positions", "relative"): "26.8 / 38.7",
    **{("clip", f"k={k}"): bleu for k, bleu in [(0, "12.5"), (1, "25.5"), (2, "25.8"), (4, "25.9"), (16, "25.8"),
                                                 (64, "25.9"), (256, "25.8")]},
    ("key_value", "aV+aK"): "25.8",
    ("key_value", "aK only"): "25.8",
    ("key_value", "aV only"): "25.3",
    ("key_value", "neither"): "12.5",
}
PAPER_COLUMN = {
    "positions": "paper: WMT14 test, En-De / En-Fr",
    "clip": "paper: En-De dev",
    "key_value": "paper: En-De dev",
    "schemes": "",
}
ROW_HEADER = {"positions": "position information", "clip": "k", "key_value": "relative terms", "schemes": "scheme"}
TITLES = {
    "positions": "Table 1: absolute vs relative position representations",
    "clip": "Table 2: clipping distance k",
    "key_value": "Table 3: relative terms in the keys (aK) and values (aV)",
    "schemes": "Position schemes",
}


@dataclass
class CellResults:
    table: str
    label: str
    runs: list[str] = field(default_factory=list)  # planned run directories
    results: list[dict[str, Any]] = field(default_factory=list)  # finished ones


@dataclass
class SweepResults:
    root: Path
    config: str
    overrides: list[str]
    cells: dict[tuple[str, str], CellResults]
    entries: dict[str, dict[str, Any]]  # every run directory of the plan -> its plan entry (seed, overrides, cells)
    results: dict[str, dict[str, Any]]  # run directory -> result.json of the finished ones

    @property
    def planned(self) -> list[str]:
        return list(self.entries)

    def signatures(self) -> list[str]:
        return sorted({r["signature"] for r in self.results.values() if "signature" in r})


# What the tables read of every finished run's result.json (rpr_mt.experiments.sweep.execute_run writes them all).
RESULT_NUMBERS = ("dev_bleu", "test_bleu", "dev_chrf", "updates", "train_seconds")
RESULT_DECODING = ("checkpoint", "beam_size", "length_penalty")


def _check_result(path: Path, result: Any) -> dict[str, Any]:
    """A run's result.json as the tables read it: a hand-edited or foreign file is a one-line error naming the file
    and key, not a KeyError after half the report."""
    if not isinstance(result, dict):
        raise UserError(f"{path}: not a run's result (a JSON object); scripts/sweep.py writes it")
    for key in (*RESULT_NUMBERS, *RESULT_DECODING):
        if key not in result:
            raise UserError(f"{path}: no '{key}': not the result of a finished run (scripts/sweep.py writes it "
                            "after decoding dev and test)")
    for key in RESULT_NUMBERS:
        if isinstance(result[key], bool) or not isinstance(result[key], (int, float)):
            raise UserError(f"{path}: '{key}' is {result[key]!r}, not a number")
    return result


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(f"{path}: not readable JSON ({exc})") from None


def load_sweep(root: str | Path, made_by: str = "scripts/sweep.py") -> SweepResults:
    """The plan and finished runs of a sweep root; ``made_by`` names the script that makes such roots in the
    error for a directory that is none."""
    root = Path(root)
    plan_path = root / "plan.json"
    if not plan_path.is_file():
        raise UserError(f"{plan_path} not found: is {root} a results root made by {made_by}?")
    plan = _read_json(plan_path)
    if not isinstance(plan, dict) or not isinstance(plan.get("runs"), dict):
        raise UserError(f"{plan_path} is not a sweep plan (no 'runs' mapping); scripts/sweep.py writes it")
    results: dict[str, dict[str, Any]] = {}
    cells: dict[tuple[str, str], CellResults] = {}
    for run_dir, entry in plan["runs"].items():
        result_path = root / run_dir / "result.json"
        result = _check_result(result_path, _read_json(result_path)) if result_path.is_file() else None
        if result is not None and (result.get("run", run_dir), result.get("seed", entry["seed"])) != (
                run_dir, entry["seed"]):
            # a run directory copied over another (seed1 into seed2): counted as a seed of its own, the mean and std
            # would rest on one run twice
            raise UserError(f"{result_path} is the result of {result.get('run')} (seed {result.get('seed')}), not of "
                            f"{run_dir} (seed {entry['seed']}): a copied run directory? move it out of the root")
        if result is not None:
            result = {**result, "update_tgt_tok_s": update_rate(root / run_dir)}
            results[run_dir] = result
        for table, label in entry["cells"]:
            cell = cells.setdefault((table, label), CellResults(table, label))
            cell.runs.append(run_dir)
            if result is not None:
                cell.results.append(result)
    check_comparable(root, results)
    return SweepResults(root, plan["config"], plan.get("overrides", []), cells, plan["runs"], results)


def check_comparable(root: Path, results: dict[str, dict[str, Any]]) -> None:
    """The finished runs (directory -> result.json) differ only in their cell's model settings and their seed, as
    their run configs (``config.yaml``) say; else a UserError naming two runs and the first setting they differ in.
    A root into which a run of another sweep was copied, or whose config was edited between seeds (roots planned
    before plan.json recorded the settings), otherwise gave a mean ± std and differences over unlike runs. A result
    written for other settings than its run's config.yaml (the run started again with others, not finished) is
    refused too. Runs without a config.yaml are not checked."""
    from rpr_mt.config import load_config
    from rpr_mt.experiments.sweep import _differences, _setting, comparable_config, recorded_fingerprints

    settings: dict[str, dict[str, Any]] = {}
    for run, result in results.items():
        path = root / run / "config.yaml"
        if not path.is_file():
            continue
        cfg = load_config(path, user_given=False)
        if "fingerprint" in result and result["fingerprint"] not in recorded_fingerprints(cfg):
            raise UserError(f"{root / run / 'result.json'} was written for other settings than {path} now holds "
                            "(the run was started again with other settings and has not finished): finish it with "
                            "scripts/sweep.py, or move the run out of the root")
        raw = comparable_config(cfg)
        raw["train"] = {key: value for key, value in raw["train"].items() if key != "seed"}
        settings[run] = raw
    first_of_name: dict[str, str] = {}
    reference = next(iter(settings), None)
    for run, raw in settings.items():
        name = run.rsplit("/", 1)[0]  # the seeds of one run name: the same config
        other = first_of_name.setdefault(name, run)
        pairs = [(other, raw), (reference, {**raw, "model": settings[reference]["model"]})]  # all: the same but model
        for against, mine in pairs:
            changed = _differences(settings[against], mine) or _differences(mine, settings[against])
            if changed:
                key = changed[0][0]
                raise UserError(f"{root / against} and {root / run} were trained with different {key} "
                                f"({_setting(settings[against], key)} vs {_setting(raw, key)}): a sweep's runs "
                                "differ only in their cell's model settings and seed, else its means and differences "
                                "compare unlike runs; move the odd run out of the root, or train it again")


def update_rate(run_dir: Path) -> float | None:
    """The training speed of a run: the median target tokens/s of its log windows (metrics.jsonl), which leave out
    validation, checkpointing and start-up. result.json's ``tgt_tok_s`` divides the run's tokens by its whole
    wall clock, validations (dev decoding) included: the literature recipe's runs logged ~8,000 tok/s and recorded
    ~6,800. None without training records."""
    rates = [record["tgt_tok_s"] for record in read_metrics(run_dir) if "tgt_tok_s" in record]
    return statistics.median(rates) if rates else None


def mean_std(values: list[float], digits: int = 2) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def render_markdown(sweep: SweepResults, title: str | None = None) -> str:
    lines = [f"# {title}" if title else f"# Sweep {sweep.root}", ""]
    lines.append(f"Base config `{sweep.config}`" + (f" with `{' '.join(sweep.overrides)}`" if sweep.overrides else "")
                 + f"; {len(sweep.results)} of {len(sweep.planned)} runs finished.")
    lines.append("")
    for table in TABLE_NAMES:
        rows = [sweep.cells[(c.table, c.label)] for c in table_cells(table) if (c.table, c.label) in sweep.cells]
        if not rows:
            continue
        lines += [f"## {TITLES[table]}", ""]
        paper = PAPER_COLUMN[table]  # "": the paper has no such table (the scheme study), so no column
        lines.append(f"| {ROW_HEADER[table]} | seeds | dev BLEU | test BLEU | dev lit. BLEU | test lit. BLEU "
                     f"| dev chrF | updates | run min | tgt tok/s |" + (f" {paper} |" if paper else ""))
        lines.append("|---" * (11 if paper else 10) + "|")
        for cell in rows:
            res = cell.results
            lit = {split: [r[f"{split}_lc_tok_bleu"] for r in res if f"{split}_lc_tok_bleu" in r]
                   for split in ("dev", "test")}  # runs scored before the literature BLEU have none
            lines.append(
                f"| {cell.label} | {len(res)}/{len(cell.runs)} "
                f"| {mean_std([r['dev_bleu'] for r in res])} | {mean_std([r['test_bleu'] for r in res])} "
                f"| {mean_std(lit['dev'])} | {mean_std(lit['test'])} "
                f"| {mean_std([r['dev_chrf'] for r in res], 1)} "
                f"| {mean_std([r['updates'] for r in res], 0)} "
                f"| {mean_std([r['train_seconds'] / 60 for r in res], 1)} "
                f"| {mean_std([r['update_tgt_tok_s'] for r in res if r['update_tgt_tok_s'] is not None], 0)} |"
                + (f" {PAPER.get((cell.table, cell.label), '')} |" if paper else "")
            )
        lines.append("")
        lines.append("run min: training's wall clock, validations included; tgt tok/s: the training speed, the "
                     "median of the log windows' target tokens/s (validation excluded).")
        lines.append("")
    signatures = sweep.signatures()
    if signatures:
        lines.append("sacreBLEU signature: " + "; ".join(f"`{s}`" for s in signatures))
        lit_signatures = sorted({r["lc_tok_signature"] for r in sweep.results.values() if "lc_tok_signature" in r})
        if lit_signatures:
            lines.append("Literature BLEU (Multi30k: lowercased, punctuation-normalized, Moses-tokenized text, "
                         "multi-bleu.perl) signature: " + "; ".join(f"`{s}`" for s in lit_signatures))
        decoding = sorted({(r["checkpoint"], r["beam_size"], r["length_penalty"]) for r in sweep.results.values()})
        lines.append("Decoding: " + "; ".join(f"{c} checkpoint, beam {b}, length penalty {a}" for c, b, a in decoding))
        lines.append("")
    lines += _code_lines(sweep)
    return "\n".join(lines)


def _code_lines(sweep: SweepResults) -> list[str]:
    """The code versions the finished runs trained with, and the runs that are not comparable because an invocation
    ran uncommitted code or the run was resumed with other code."""
    code = {d: r.get("code", ["unrecorded"]) for d, r in sorted(sweep.results.items())}  # older runs recorded none
    if not code:
        return []
    lines = ["Code: " + ", ".join(f"`{v}`" for v in sorted({v for versions in code.values() for v in versions}))]
    suspect = [f"{d} ({' → '.join(versions)})" for d, versions in code.items()
               if len(versions) > 1 or any(v.endswith(".dirty") or v == "unrecorded" for v in versions)]
    if suspect:
        lines.append("Runs with mixed, uncommitted or unrecorded code (not comparable): " + ", ".join(suspect))
    return lines + [""]


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """A run's training and validation records in update order, each update once: the records of updates that a
    resumed invocation redid are replaced by the redone ones (``rpr_mt.curves.read_curves``)."""
    if not (run_dir / "metrics.jsonl").is_file():
        return []
    try:
        train, dev = read_curves(run_dir)
    except UserError:  # no records yet
        return []
    return sorted(train + dev, key=lambda record: record["step"])  # stable: an update's training record first


def plot(sweep: SweepResults, out_dir: str | Path, prefix: str = "") -> list[Path]:
    """BLEU vs k (if the clip table has results) and dev BLEU / dev loss vs update per run, as PNG files."""
    plt = pyplot()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    clip_cells = [sweep.cells.get(("clip", c.label)) for c in table_cells("clip")]
    clip_cells = [c for c in clip_cells if c is not None and c.results]
    if clip_cells:
        fig, ax = plt.subplots(figsize=(6, 4))
        x = list(range(len(clip_cells)))
        for split, marker in (("dev", "o"), ("test", "s")):
            values = [[r[f"{split}_bleu"] for r in c.results] for c in clip_cells]
            means = [statistics.mean(v) for v in values]
            errors = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in values]
            ax.errorbar(x, means, yerr=errors, marker=marker, capsize=3, label=f"{split} BLEU")
        ax.set_xticks(x, [c.label.removeprefix("k=") for c in clip_cells])
        ax.set_xlabel("clipping distance k")
        ax.set_ylabel("sacreBLEU")
        ax.set_title("BLEU vs k (mean ± std over seeds)")
        ax.grid(alpha=0.3)
        ax.legend()
        path = out_dir / f"{prefix}bleu_vs_k.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)

    curves = {run: [m for m in read_metrics(sweep.root / run) if "dev_nll" in m] for run in sweep.planned}
    curves = {run: points for run, points in curves.items() if points}
    if curves:
        fig, (ax_bleu, ax_loss) = plt.subplots(1, 2, figsize=(11, 4))
        for run, points in sorted(curves.items()):
            steps = [p["step"] for p in points]
            ax_loss.plot(steps, [p["dev_nll"] for p in points], label=run, linewidth=1)
            with_bleu = [p for p in points if p.get("dev_bleu") is not None]
            if with_bleu:
                ax_bleu.plot([p["step"] for p in with_bleu], [p["dev_bleu"] for p in with_bleu], label=run,
                             linewidth=1)
        ax_bleu.set(xlabel="update", ylabel="dev BLEU (validation decode)", title="dev BLEU during training")
        ax_loss.set(xlabel="update", ylabel="dev NLL per token", title="dev loss during training")
        for ax in (ax_bleu, ax_loss):
            ax.grid(alpha=0.3)
        ax_loss.legend(fontsize=6, ncol=2)
        path = out_dir / f"{prefix}curves.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written
