"""BLEU by source-sentence length, per sweep cell: where in the length range a position representation helps or hurts.

A corpus BLEU hides how a model does on long inputs when most sentences are short (Multi30k's dev and test captions
average 12 words). Splitting the sentences of one split into source-length buckets and scoring each bucket as a corpus
of its own shows, for example, whether the loss of a model without order information (k = 0) grows with length.

Lengths are whitespace words of the cleaned source text (what ``translate`` reads), not subwords, so buckets do not
depend on the vocabulary. Each bucket is scored with sacreBLEU's default BLEU, the metric of the sweep tables.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from sacrebleu.metrics import BLEU

from rpr_mt.errors import UserError
from rpr_mt.experiments.outputs import cell_rows, literature_preps, load_split_outputs
from rpr_mt.experiments.tables import SweepResults, mean_std
from rpr_mt.plotting import pyplot


@dataclass(frozen=True)
class Bucket:
    low: int  # inclusive, in source words; 0 for the first bucket
    high: int | None  # inclusive; None = no upper bound

    def contains(self, length: int) -> bool:
        return self.low <= length and (self.high is None or length <= self.high)

    @property
    def label(self) -> str:
        if self.high is None:
            return f"≥ {self.low}"
        if self.low == 0:
            return f"≤ {self.high}"
        return f"{self.low}" if self.low == self.high else f"{self.low}–{self.high}"


def buckets_from_edges(edges: Sequence[int]) -> list[Bucket]:
    """``[10, 13, 16]`` -> ≤ 9, 10–12, 13–15, ≥ 16 words: each edge is the first length of a new bucket."""
    if any(e < 2 for e in edges) or list(edges) != sorted(set(edges)):
        raise UserError(f"length edges must be increasing integers >= 2, got {list(edges)}")
    starts = [0, *edges]
    return [Bucket(lo, hi - 1) for lo, hi in zip(starts, starts[1:])] + [Bucket(starts[-1], None)]


def quartile_edges(lengths: Sequence[int]) -> list[int]:
    """Edges that split ``lengths`` into (roughly) four equally full buckets; fewer where lengths repeat a lot."""
    if len(lengths) < 2:
        raise UserError("need at least 2 sentences to choose length buckets")
    quartiles = statistics.quantiles(lengths, n=4, method="inclusive")
    return sorted({int(q) + 1 for q in quartiles if min(lengths) < int(q) + 1 <= max(lengths)})


def bleu_by_length(
    sources: Sequence[str], hypotheses: Sequence[str], references: Sequence[str], buckets: Sequence[Bucket],
    pretokenized: bool = False,
) -> list[tuple[int, float | None]]:
    """(sentence count, corpus BLEU) per bucket; BLEU is None for an empty bucket. sacreBLEU, or for
    ``pretokenized`` text (Multi30k's tokenized files) the literature's BLEU of the text as it is."""
    if not len(sources) == len(hypotheses) == len(references):
        raise UserError(f"{len(sources)} sources, {len(hypotheses)} hypotheses and {len(references)} references: "
                        "they must be line-aligned")
    lengths = [len(s.split()) for s in sources]
    metric = BLEU(tokenize="none", smooth_method="none", force=True) if pretokenized else BLEU()
    scores: list[tuple[int, float | None]] = []
    for bucket in buckets:
        idx = [i for i, n in enumerate(lengths) if bucket.contains(n)]
        if not idx:
            scores.append((0, None))
            continue
        bleu = metric.corpus_score([hypotheses[i] for i in idx], [[references[i] for i in idx]])
        scores.append((len(idx), bleu.score))
    return scores


@dataclass
class LengthTable:
    split: str
    buckets: list[Bucket]
    counts: list[int]  # sentences per bucket
    rows: list[tuple[str, list[list[float]]]]  # (cell labels, per bucket: the BLEU of each seed)
    metric: str = "sacreBLEU"  # or the literature's BLEU, on runs of Multi30k's tokenized text


def length_table(
    sweep: SweepResults, split: str, edges: Sequence[int] | None = None, data_dir: str | Path | None = None
) -> LengthTable:
    """Bucket BLEU of every finished run, one row per distinct set of runs (cells that share runs are one row).
    ``edges`` default to the quartiles of the split's source lengths."""
    outputs = load_split_outputs(sweep, split, data_dir)
    lengths = [len(s.split()) for s in outputs.sources]
    buckets = buckets_from_edges(edges if edges is not None else quartile_edges(lengths))
    pretokenized = literature_preps(sweep) == {"pretokenized"}
    per_run = {run: bleu_by_length(outputs.sources, hyps, outputs.references, buckets, pretokenized)
               for run, hyps in outputs.hypotheses.items()}
    counts = [n for n, _ in next(iter(per_run.values()))]
    rows = []
    for runs, labels in cell_rows(sweep, per_run).items():
        scores = [[per_run[r][i][1] for r in runs if per_run[r][i][1] is not None] for i in range(len(buckets))]
        rows.append((" = ".join(labels), scores))
    return LengthTable(split, buckets, counts, rows,
                       "literature BLEU (tokenized text, as it is)" if pretokenized else "sacreBLEU")


def render_length_table(table: LengthTable) -> str:
    """Markdown: one row per cell, one column per bucket, mean ± std of the bucket BLEU over seeds."""
    header = " | ".join(f"{b.label} words ({n})" for b, n in zip(table.buckets, table.counts))
    lines = [f"| cell | seeds | {header} |", "|---|---|" + "---|" * len(table.buckets)]
    for label, scores in table.rows:
        seeds = max(len(s) for s in scores)
        lines.append(f"| {label} | {seeds} | " + " | ".join(mean_std(s) for s in scores) + " |")
    return "\n".join(lines)


def plot_length_table(table: LengthTable, out_dir: str | Path, prefix: str = "") -> Path:
    """Mean bucket BLEU against source length, one line per cell, as ``<prefix>bleu_by_length.png``."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = list(range(len(table.buckets)))
    for i, (label, scores) in enumerate(table.rows):
        means = [statistics.mean(s) if s else float("nan") for s in scores]
        # 10 colours, then the same colours dashed: Tables 1-3 have 11 distinct rows.
        ax.plot(x, means, marker="o", linewidth=1.2, color=f"C{i % 10}", linestyle="-" if i < 10 else "--", label=label)
    ax.set_xticks(x, [f"{b.label}\n({n})" for b, n in zip(table.buckets, table.counts)])
    ax.set(xlabel="source words (sentences)", ylabel=f"{table.split} BLEU of the bucket",
           title=f"{table.split} BLEU by source length (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    path = Path(out_dir) / f"{prefix}bleu_by_length.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
