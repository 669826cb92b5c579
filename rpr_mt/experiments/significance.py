"""Paired bootstrap resampling of every sweep cell against the base run of the same seed.

Two kinds of noise hide in a BLEU difference of a CPU-scale sweep: the training seed (what mean ± std over seeds
shows) and the choice of test sentences for one pair of trained models (what this shows). With one or two seeds and
~1,000 sentences, either can be as large as the effects the paper reports, so the findings in docs/results.md are
read against both.

The test is sacreBLEU's own (``sacrebleu --paired-bs``, Koehn 2004 as implemented after multeval): 1,000 resamples of
the sentences with a fixed seed, and a two-sided p-value for the absolute BLEU difference. ``metric="lit"`` resamples
the Multi30k literature's BLEU (rpr_mt.evaluate: lowercased, normalized, Moses-tokenized text, no further
tokenization) instead of sacreBLEU's.

Each cell's row also says what the paper claims of it against the same comparison (``PAPER``: its En-De numbers, and
for Table 1 of a sweep into French its En-Fr ones) and whether our seeds bear that out (``verdict``), so
docs/results.md's verdicts come from this command, not by hand.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Literal, Sequence

from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from rpr_mt.errors import UserError
from rpr_mt.text.multi30k import lowercase_normalize_tokenize
from rpr_mt.experiments.outputs import SplitOutputs, cell_rows, literature_preps, load_split_outputs
from rpr_mt.experiments.sweep import TABLE_NAMES, table_cells
from rpr_mt.experiments.tables import PAPER, SweepResults, mean_std

N_SAMPLES = 1000
Metric = Literal["sacrebleu", "lit"]
METRIC_NAMES = {"sacrebleu": "sacreBLEU", "lit": "literature BLEU (lc.norm.tok)"}
# A seed's difference is beyond the choice of test sentences when its paired-bootstrap p is below this.
ALPHA = 0.05
# The paper prints BLEU to one decimal and reads its cells 0.1 apart as alike (k = 2, 4, 64, 256 and aK only against
# k = 16 / aK+aV): a paper difference smaller than this is a claim that the cell is level with the comparison, one
# at least this large a claim that it is below (k = 0, k = 1, aV only, neither; absolute against relative) or above.
PAPER_LEVEL_BLEU = 0.2


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


@dataclass(frozen=True)
class Claim:
    """What the paper's numbers say of a cell against the comparison: its BLEU minus the comparison's."""

    paper_delta: float

    @property
    def kind(self) -> Literal["below", "above", "level"]:
        if abs(self.paper_delta) < PAPER_LEVEL_BLEU:
            return "level"
        return "below" if self.paper_delta < 0 else "above"

    def describe(self, against: str) -> str:
        return f"{'level with' if self.kind == 'level' else self.kind} {against} ({self.paper_delta:+.1f})"


def _paper_bleu(cell: tuple[str, str], tgt_lang: str) -> float | None:
    """The paper's BLEU of ``cell``: Table 1 holds "En-De / En-Fr" (the second for a sweep into French), Tables 2 and
    3 En-De only."""
    text = PAPER.get(cell)
    if not text:
        return None
    pairs = text.split("/")
    return float(pairs[1] if tgt_lang == "fr" and len(pairs) > 1 else pairs[0])


def paper_language_pair(tgt_lang: str) -> str:
    """Which of the paper's language pairs the claims of a sweep into ``tgt_lang`` come from (``_paper_bleu``)."""
    return "En-Fr; Tables 2 and 3: En-De" if tgt_lang == "fr" else "En-De"


def paper_claim(labels: Sequence[str], base_labels: Collection[str], tgt_lang: str = "de") -> Claim | None:
    """The paper's claim about a row (the cells ``labels``, backed by the same runs) against the comparison row
    (``base_labels``): the first of the row's cells that the paper compares with a comparison cell of the same table
    (Table 1 is WMT14 test, Tables 2 and 3 dev: numbers of different tables are not compared), in the paper's En-Fr
    numbers for a sweep into French (``tgt_lang``) where it has them. None where there is no such pair (the schemes
    table; k = 0 against an absolute base run)."""
    table_of = {cell.label: cell.table for table in TABLE_NAMES for cell in table_cells(table)}
    for label in labels:
        table = table_of.get(label)
        paper = _paper_bleu((table, label), tgt_lang) if table else None
        bases = [_paper_bleu((table, base), tgt_lang) for base in base_labels if table_of.get(base) == table]
        if paper is not None and bases and bases[0] is not None:
            return Claim(round(paper - bases[0], 1))  # one decimal, as the paper: 25.9 - 25.8 is 0.1, not 0.0999
    return None


def verdict(claim: Claim, deltas: Sequence[float], p_values: Sequence[float], alpha: float = ALPHA) -> str:
    """Whether the seeds' differences (ours minus the comparison, one per seed) and their paired-bootstrap p-values
    bear the paper's claim out. Below (above): "holds" when every seed is significantly below (above), "does not
    hold" when every seed is significantly the other way, else "within noise". Level: "holds" when no seed is
    significant, "does not hold" when every seed is significant in the same direction, else "within noise"."""
    if len(deltas) != len(p_values):
        raise ValueError(f"{len(deltas)} differences and {len(p_values)} p-values")
    if not deltas:
        return "–"
    below = all(d < 0 and p < alpha for d, p in zip(deltas, p_values))
    above = all(d > 0 and p < alpha for d, p in zip(deltas, p_values))
    if claim.kind == "level":
        text = ("holds" if all(p >= alpha for p in p_values) else "does not hold" if below or above
                else "within noise")
    elif (claim.kind == "below" and below) or (claim.kind == "above" and above):
        text = "holds"
    elif below or above:
        text = "does not hold"
    else:
        text = "within noise"
    return text + (" (1 seed)" if len(deltas) == 1 else "")


def verdict_rule(against: str, tgt_lang: str = "de") -> str:
    """The paragraph under the table that says how the verdict column is read (``against``: "the base run")."""
    pair = "En-Fr BLEU (Tables 2 and 3: En-De, the only pair they have)" if tgt_lang == "fr" else "En-De BLEU"
    return (f"paper: the cell's {pair} in Shaw et al. (2018) minus that of {against} in the same table (Table 1 "
            f"test, Tables 2 and 3 dev); a difference smaller than {PAPER_LEVEL_BLEU} BLEU either way is the claim that the two are "
            f"level, a larger one that the cell is below (or above) it. Verdict, with a seed significant when its "
            f"p < {ALPHA}: a below (above) claim holds when every seed is significantly below (above) {against}, "
            "does not hold when every seed is significantly the other way, and is within noise otherwise; a level "
            "claim holds when no seed is significant, does not hold when every seed is significant in the same "
            "direction, and is within noise otherwise. \"(1 seed)\": the verdict rests on one seed.")


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
    against = baseline or "base"
    lines = [f"| cell | seeds | Δ {split} {METRIC_NAMES[metric]} vs {against} | p per seed (paired "
             f"bootstrap, {n_samples} resamples) | paper ({paper_language_pair(outputs.tgt_lang)}) | verdict |",
             "|---|---|---|---|---|---|"]
    rows = cell_rows(sweep, outputs.hypotheses)
    base_labels = [label for runs, labels in rows.items() if runs and all(r in bases.values() for r in runs)
                   for label in labels]
    for runs, labels in rows.items():
        deltas, p_values = [], []
        for run in runs:
            seed = int(sweep.entries[run]["seed"])
            if run in bases.values() or seed not in bases:
                continue
            delta, p = paired_bootstrap(outputs.hypotheses[bases[seed]], outputs.hypotheses[run],
                                        outputs.references, n_samples, metric)
            deltas.append(delta)
            p_values.append((p, seed))
        if runs and all(r in bases.values() for r in runs):
            lines.append(f"| {' = '.join(labels)} | {len(runs)} | base | | | |")
            continue
        claim = paper_claim(labels, base_labels, outputs.tgt_lang)
        ps = ", ".join(f"{p:.3f} (seed {seed})" for p, seed in p_values) or "–"
        lines.append(f"| {' = '.join(labels)} | {len(deltas)} | {_signed(deltas)} | {ps} "
                     f"| {claim.describe(against) if claim else '–'} "
                     f"| {verdict(claim, deltas, [p for p, _ in p_values]) if claim else '–'} |")
    against_text = "the base run" if baseline is None else f"the {baseline} run"
    return "\n".join(lines + ["", verdict_rule(against_text, outputs.tgt_lang)])


def _signed(values: list[float]) -> str:
    text = mean_std(values)
    return text if not values or statistics.mean(values) < 0 else "+" + text
