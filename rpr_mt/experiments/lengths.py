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
from rpr_mt.experiments.outputs import cell_rows, load_split_outputs
from rpr_mt.experiments.tables import SweepResults, mean_std


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
    sources: Sequence[str], hypotheses: Sequence[str], references: Sequence[str], buckets: Sequence[Bucket]
) -> list[tuple[int, float | None]]:
    """(sentence count, corpus BLEU) per bucket; BLEU is None for an empty bucket."""
    if not len(sources) == len(hypotheses) == len(references):
        raise UserError(f"{len(sources)} sources, {len(hypotheses)} hypotheses and {len(references)} references: "
                        "they must be line-aligned")
    lengths = [len(s.split()) for s in sources]
    scores: list[tuple[int, float | None]] = []
    for bucket in buckets:
        idx = [i for i, n in enumerate(lengths) if bucket.contains(n)]
        if not idx:
            scores.append((0, None))
            continue
        bleu = BLEU().corpus_score([hypotheses[i] for i in idx], [[references[i] for i in idx]])
        scores.append((len(idx), bleu.score))
    return scores


def render_length_table(
    sweep: SweepResults, split: str, edges: Sequence[int] | None = None, data_dir: str | Path | None = None
) -> str:
    """Markdown: one row per distinct set of finished runs (cells that share runs are one row), one column per
    source-length bucket, mean ± std of the bucket BLEU over seeds. ``edges`` default to the split's quartiles."""
    outputs = load_split_outputs(sweep, split, data_dir)
    lengths = [len(s.split()) for s in outputs.sources]
    buckets = buckets_from_edges(edges if edges is not None else quartile_edges(lengths))
    per_run = {run: bleu_by_length(outputs.sources, hyps, outputs.references, buckets)
               for run, hyps in outputs.hypotheses.items()}
    rows = cell_rows(sweep, per_run)
    counts = next(iter(per_run.values()))
    header = " | ".join(f"{b.label} words ({n})" for b, (n, _) in zip(buckets, counts))
    lines = [f"| cell | seeds | {header} |", "|---|---|" + "---|" * len(buckets)]
    for runs, labels in rows.items():
        values = []
        for i in range(len(buckets)):
            scores = [per_run[r][i][1] for r in runs]
            values.append(mean_std([s for s in scores if s is not None]))
        lines.append(f"| {' = '.join(labels)} | {len(runs)} | " + " | ".join(values) + " |")
    return "\n".join(lines)
