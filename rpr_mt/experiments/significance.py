"""Paired bootstrap resampling of every sweep cell against the base run of the same seed.

Two kinds of noise hide in a BLEU difference of a CPU-scale sweep: the training seed (what mean ± std over seeds
shows) and the choice of test sentences for one pair of trained models (what this shows). With one or two seeds and
~1,000 sentences, either can be as large as the effects the paper reports, so the findings in docs/results.md are
read against both.

The test is sacreBLEU's own (``sacrebleu --paired-bs``, Koehn 2004 as implemented after multeval): 1,000 resamples of
the sentences with a fixed seed, and a two-sided p-value for the absolute BLEU difference. ``metric="lit"`` resamples
the Multi30k literature's BLEU (rpr_mt.evaluate: lowercased, normalized, Moses-tokenized text, no further
tokenization) instead of sacreBLEU's.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Literal, Sequence

from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from rpr_mt.errors import UserError
from rpr_mt.evaluate import lowercase_normalize_tokenize
from rpr_mt.experiments.outputs import SplitOutputs, cell_rows, literature_preps, load_split_outputs
from rpr_mt.experiments.tables import SweepResults, mean_std

N_SAMPLES = 1000
Metric = Literal["sacrebleu", "lit"]
METRIC_NAMES = {"sacrebleu": "sacreBLEU", "lit": "literature BLEU (lc.norm.tok)"}


def paired_bootstrap(
    baseline: Sequence[str], system: Sequence[str], references: Sequence[str], n_samples: int = N_SAMPLES,
    metric: Metric = "sacrebleu",
) -> tuple[float, float]:
    """(BLEU of ``system`` minus BLEU of ``baseline``, two-sided p-value of the paired bootstrap; 1.0 when the
    difference is exactly 0). With ``metric="lit"`` all three are already lowercased, normalized, tokenized text,
    scored as they are."""
    if not len(baseline) == len(system) == len(references):
        raise UserError(f"{len(baseline)} baseline, {len(system)} system and {len(references)} reference lines: "
                        "they must be line-aligned")
    bleu = BLEU(tokenize="none", smooth_method="none", force=True) if metric == "lit" else BLEU()
    test = PairedTest([("baseline", list(baseline)), ("system", list(system))], {"BLEU": bleu}, [list(references)],
                      test_type="bs", n_samples=n_samples)
    _, scores = test()
    base_result, system_result = scores["BLEU"]
    difference = system_result.score - base_result.score
    if difference == 0:
        # sacreBLEU keeps multeval's convention that a zero difference is not chance: identical outputs get the
        # smallest p (1 / (n + 1)), which a table would read as a significant difference of +0.00
        return difference, 1.0
    return difference, float(system_result.p_value)


def _base_runs(sweep: SweepResults, runs: Sequence[str]) -> dict[int, str]:
    """seed -> the finished run of the unmodified base config (no overrides) with that seed."""
    bases = {}
    for run in runs:
        entry = sweep.entries.get(run, {})
        if entry.get("overrides") == []:
            bases[int(entry["seed"])] = run
    return bases


def _lit_text(sweep: SweepResults, outputs: SplitOutputs) -> SplitOutputs:
    """The outputs as the literature's BLEU reads them: raw text lowercased, normalized and tokenized; runs trained on
    Multi30k's tokenized text (their result.json says so) as they are."""
    preps = literature_preps(sweep)
    if preps == {"pretokenized"}:
        return outputs
    if preps != {"lc.norm.tok"}:
        raise UserError(f"the runs under {sweep.root} were not all scored with the same literature BLEU (runs from "
                        "before it, or raw and tokenized data mixed): their result.json lack or differ in "
                        "lc_tok_signature")
    return SplitOutputs(outputs.sources, lowercase_normalize_tokenize(outputs.references, outputs.tgt_lang),
                        {run: lowercase_normalize_tokenize(hyps, outputs.tgt_lang)
                         for run, hyps in outputs.hypotheses.items()}, outputs.tgt_lang)


def render_significance_table(
    sweep: SweepResults, split: str, data_dir: str | Path | None = None, n_samples: int = N_SAMPLES,
    metric: Metric = "sacrebleu",
) -> str:
    """Markdown: per cell, its BLEU minus the same seed's base run (mean ± std over seeds) and each seed's p-value."""
    outputs = load_split_outputs(sweep, split, data_dir)
    if metric == "lit":
        outputs = _lit_text(sweep, outputs)
    bases = _base_runs(sweep, list(outputs.hypotheses))
    if not bases:  # said in the report, whose tables and plots are still wanted: not an error
        planned = [run for run, entry in sweep.entries.items() if not entry.get("overrides")]
        if planned:
            return (f"Not computed: the base run (the config without overrides) has not finished yet "
                    f"({', '.join(planned)}).")
        return ("Not computed: no run of this sweep is the base config without overrides (every planned cell "
                "changes it), so there is nothing to compare the cells with.")
    lines = [f"| cell | seeds | Δ {split} {METRIC_NAMES[metric]} vs base | p per seed (paired bootstrap, {n_samples} "
             "resamples) |", "|---|---|---|---|"]
    for runs, labels in cell_rows(sweep, outputs.hypotheses).items():
        deltas, p_values = [], []
        for run in runs:
            seed = int(sweep.entries[run]["seed"])
            if run in bases.values() or seed not in bases:
                continue
            delta, p = paired_bootstrap(outputs.hypotheses[bases[seed]], outputs.hypotheses[run],
                                        outputs.references, n_samples, metric)
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
