"""The saved translations of a sweep's finished runs, with their split's sources and references, for analyses that
rescore them (BLEU by length, paired bootstrap) without decoding again."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Collection

from rpr_mt.errors import UserError
from rpr_mt.experiments.sweep import TABLE_NAMES, table_cells
from rpr_mt.experiments.tables import SweepResults


@dataclass
class SplitOutputs:
    sources: list[str]
    references: list[str]
    hypotheses: dict[str, list[str]]  # finished run directory -> its <split>.hyp lines
    tgt_lang: str  # the references' language


def _run_data_dir(run_dir: Path) -> Path:
    from rpr_mt.config import load_config

    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise UserError(f"{config_path} not found: pass --data-dir to say where the prepared data is")
    from rpr_mt.checkpoint_files import prepared_data_of

    # a sweep's run config holds the base config's settings for every cell (an absolute cell's model.clip): not
    # the user's to act on, so no warning about them
    saved = load_config(config_path, user_given=False)
    data_dir = prepared_data_of(saved.data.output_dir, config_path)  # from any directory
    if not data_dir.is_dir():
        raise UserError(f"data directory {data_dir} (from {config_path}) not found: run from the directory the "
                        "sweep ran in, or pass --data-dir")
    return data_dir


def load_split_outputs(sweep: SweepResults, split: str, data_dir: str | Path | None = None) -> SplitOutputs:
    """Every finished run's ``<split>.hyp`` with the split's source and reference text, checked line-aligned.
    ``data_dir`` defaults to the runs' own ``data.output_dir``, which must be the same for all of them."""
    from rpr_mt.data.prepare import reference_files
    from rpr_mt.lines import read_lines

    if split not in ("dev", "test"):
        raise UserError(f"expected the split dev or test, not '{split}'")
    finished = sorted(sweep.results)
    if not finished:
        raise UserError(f"no finished runs under {sweep.root}")
    data_dirs = {Path(data_dir)} if data_dir is not None else {_run_data_dir(sweep.root / r) for r in finished}
    if len(data_dirs) > 1:
        raise UserError(f"the runs use different data directories ({', '.join(map(str, sorted(data_dirs)))}): "
                        "their translations are not comparable")
    src_path, ref_path = reference_files(data_dirs.pop(), split)
    sources, references = read_lines(src_path), read_lines(ref_path)
    hypotheses: dict[str, list[str]] = {}
    for run in finished:
        hyp_path = sweep.root / run / f"{split}.hyp"
        if not hyp_path.is_file():
            raise UserError(f"{hyp_path} not found: the run finished but its {split} translation is missing")
        hypotheses[run] = read_lines(hyp_path)
        if len(hypotheses[run]) != len(sources):
            raise UserError(f"{hyp_path} has {len(hypotheses[run])} lines, {src_path} has {len(sources)}")
    return SplitOutputs(sources, references, hypotheses, ref_path.suffix.lstrip("."))


def literature_preps(sweep: SweepResults) -> set[str]:
    """How the finished runs' literature BLEU read their text, from their result.json: {"pretokenized"} for runs
    trained and scored on Multi30k's tokenized text, {"lc.norm.tok"} for raw text (lowercased, normalized and
    tokenized before scoring); "" for a run from before that signature."""
    return {r.get("lc_tok_signature", "").rpartition("|prep:")[2] for r in sweep.results.values()}


def cell_rows(sweep: SweepResults, runs: Collection[str]) -> dict[tuple[str, ...], list[str]]:
    """Table rows over the given runs, in table order: each distinct set of runs with the labels of the cells it
    backs (the base run is Table 1's 'relative', Table 2's k and Table 3's 'aV+aK' at once, so one row)."""
    rows: dict[tuple[str, ...], list[str]] = {}
    for table in TABLE_NAMES:
        for cell in table_cells(table):
            results = sweep.cells.get((cell.table, cell.label))
            backing = tuple(sorted(r for r in results.runs if r in runs)) if results else ()
            if backing:
                rows.setdefault(backing, []).append(cell.label)
    return rows
