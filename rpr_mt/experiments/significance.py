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


def check_baseline(sweep: SweepResults, baseline: str | None) -> None:
    """A ``--baseline`` cell that this sweep does not plan is a UserError naming the cells it does (asked of the
    report before any of it is written)."""
    if baseline is None or any(label == baseline for _, label in sweep.cells):
        return
    labels = [label for _, label in sweep.cells]
    raise UserError(f"--baseline {baseline!r} is not a cell of the sweep under {sweep.root} (its cells: "
                    f"{', '.join(labels[:8])}{', ...' if len(labels) > 8 else ''})")


def comparison_runs(sweep: SweepResults, baseline: str | None = None) -> tuple[dict[int, str], str | None]:
    """(seed -> the finished run every cell of that seed is compared with, why there is none). The comparison is the
    base config without overrides, or the cell labelled ``baseline`` (e.g. "k=16", when a --tables clip sweep's base
    k is none of the paper's). No finished one is no error: the report's tables and plots are still wanted, and its
    bootstrap section says why it is missing."""
    check_baseline(sweep, baseline)
    if baseline is None:
        planned = [run for run, entry in sweep.entries.items() if entry.get("overrides") == []]
        name = "the base run (the config without overrides)"
    else:
        planned = sorted({run for (_, label), cell in sweep.cells.items() if label == baseline for run in cell.runs})
        name = f"the '{baseline}' run"
    found = {int(sweep.entries[run]["seed"]): run for run in planned if run in sweep.results}
    if found:
        return found, None
    if planned:
        return {}, f"{name} has not finished yet ({', '.join(planned)})"
    return {}, ("no run of this sweep is the base config without overrides (every planned cell changes it), so there "
                "is nothing to compare the cells with; --baseline CELL compares them with one of the cells")


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
    metric: Metric = "sacrebleu", baseline: str | None = None,
) -> str:
    """Markdown: per cell, its BLEU minus the same seed's base run, or ``baseline`` cell's run (mean ± std over
    seeds), and each seed's p-value; without a finished one to compare with, a line saying why."""
    bases, missing = comparison_runs(sweep, baseline)
    if missing:  # before any data is read: there may be none yet either
        return f"Not computed: {missing}."
    outputs = load_split_outputs(sweep, split, data_dir)
    if metric == "lit":
        outputs = _lit_text(sweep, outputs)
    lines = [f"| cell | seeds | Δ {split} {METRIC_NAMES[metric]} vs {baseline or 'base'} | p per seed (paired "
             f"bootstrap, {n_samples} resamples) |", "|---|---|---|---|"]
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
