"""Paired bootstrap resampling of every sweep cell against the base run of the same seed.

Two kinds of noise hide in a BLEU difference of a CPU-scale sweep: the training seed (what mean ± std over seeds
shows) and the choice of test sentences for one pair of trained models (what this shows). With one or two seeds and
~1,000 sentences, either can be as large as the effects the paper reports, so the findings in docs/results.md are
read against both.

The test is sacreBLEU's own (``sacrebleu --paired-bs``, Koehn 2004 as implemented after multeval): 1,000 resamples of
the sentences with a fixed seed, and a two-sided p-value for the absolute BLEU difference.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Sequence

from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from rpr_mt.errors import UserError
from rpr_mt.experiments.outputs import cell_rows, load_split_outputs
from rpr_mt.experiments.tables import SweepResults, mean_std

N_SAMPLES = 1000


def paired_bootstrap(
    baseline: Sequence[str], system: Sequence[str], references: Sequence[str], n_samples: int = N_SAMPLES
) -> tuple[float, float]:
    """(BLEU of ``system`` minus BLEU of ``baseline``, two-sided p-value of the paired bootstrap)."""
    if not len(baseline) == len(system) == len(references):
        raise UserError(f"{len(baseline)} baseline, {len(system)} system and {len(references)} reference lines: "
                        "they must be line-aligned")
    test = PairedTest([("baseline", list(baseline)), ("system", list(system))], {"BLEU": BLEU()}, [list(references)],
                      test_type="bs", n_samples=n_samples)
    _, scores = test()
    base_result, system_result = scores["BLEU"]
    return system_result.score - base_result.score, float(system_result.p_value)


def _base_runs(sweep: SweepResults, runs: Sequence[str]) -> dict[int, str]:
    """seed -> the finished run of the unmodified base config (no overrides) with that seed."""
    bases = {}
    for run in runs:
        entry = sweep.entries.get(run, {})
        if entry.get("overrides") == []:
            bases[int(entry["seed"])] = run
    return bases


def render_significance_table(
    sweep: SweepResults, split: str, data_dir: str | Path | None = None, n_samples: int = N_SAMPLES
) -> str:
    """Markdown: per cell, its BLEU minus the same seed's base run (mean ± std over seeds) and each seed's p-value."""
    outputs = load_split_outputs(sweep, split, data_dir)
    bases = _base_runs(sweep, list(outputs.hypotheses))
    if not bases:
        raise UserError(f"no finished base run (the config without overrides) under {sweep.root} to compare with")
    lines = [f"| cell | seeds | Δ {split} BLEU vs base | p per seed (paired bootstrap, {n_samples} resamples) |",
             "|---|---|---|---|"]
    for runs, labels in cell_rows(sweep, outputs.hypotheses).items():
        deltas, p_values = [], []
        for run in runs:
            seed = int(sweep.entries[run]["seed"])
            if run in bases.values() or seed not in bases:
                continue
            delta, p = paired_bootstrap(outputs.hypotheses[bases[seed]], outputs.hypotheses[run],
                                        outputs.references, n_samples)
            deltas.append(delta)
            p_values.append(f"{p:.3f} (seed {seed})")
        if runs and all(r in bases.values() for r in runs):
            lines.append(f"| {' = '.join(labels)} | {len(runs)} | base | |")
        else:
            lines.append(f"| {' = '.join(labels)} | {len(deltas)} | {_signed(deltas)} | {', '.join(p_values) or '–'} |")
    return "\n".join(lines)


def _signed(values: list[float]) -> str:
    text = mean_std(values)
    return text if not values or statistics.mean(values) < 0 else "+" + text
