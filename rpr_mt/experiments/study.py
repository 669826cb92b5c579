"""The position-scheme study: every scheme trained as in the sweep, then tested on inputs longer than any seen in
training (docs/positions.md).

Long inputs: from each Multi30k dev and test split, groups of ``f`` consecutive sentences joined by a space, for
f = 2, 3, 4 (the sources and the references joined the same way; a last group of fewer than f sentences is dropped),
beside the originals (f = 1). Joined sentences are still one line to translate: the model must translate an input
f times as long as a usual one, past the training cap ``data.max_train_tokens``.

Per finished run, ``evaluate_long`` decodes every set (f = 1 reuses the sweep's own ``<split>.hyp`` when its result
records today's decode settings; otherwise it decodes its own, ``long/<split>.x1.hyp``) with the run's scored checkpoint and decode settings and writes ``long_results.json``: sacreBLEU, chrF and the hypothesis/reference
length ratio per set, and BLEU per source-length bucket over all sets of a split together. It says what it cut:
sources longer than ``model.max_positions - 1`` pieces (truncated by ``translate``) and hypotheses that stopped at the
output length limit without eos. Resumable: a run whose ``long_results.json`` matches its config and sets is skipped,
and hypothesis files already there are rescored without loading the model (a run kept in results/ has no weights).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from sacrebleu.metrics import BLEU, CHRF

from rpr_mt.config import Config
from rpr_mt.errors import UserError
from rpr_mt.experiments.lengths import bleu_by_length, buckets_from_edges
from rpr_mt.experiments.sweep import comparable_config, config_fingerprint, decode_settings, recorded_decode, \
    recorded_fingerprints
from rpr_mt.files import write_json, write_lines

__all__ = ["FACTORS", "LENGTH_EDGES", "bucket_table", "corpus_scores", "evaluate_long", "join_consecutive",
           "long_sets", "plot_study", "render_bootstrap", "render_study_table", "write_long_sets"]

FACTORS = (1, 2, 3, 4)
SPLITS = ("dev", "test")
# Source-length buckets (whitespace words) over the original and joined sets together: Multi30k captions average
# 12 words, so x4 inputs reach ~50 and the longest ~110.
LENGTH_EDGES = (10, 15, 20, 30, 40, 60, 80)


def join_consecutive(lines: Sequence[str], factor: int) -> list[str]:
    """Lines 0..f-1 joined by one space, then f..2f-1, ...; a last group shorter than ``factor`` is dropped."""
    if factor < 1:
        raise ValueError(f"factor must be >= 1, got {factor}")
    usable = len(lines) - len(lines) % factor
    return [" ".join(line.strip() for line in lines[i : i + factor]) for i in range(0, usable, factor)]


def long_sets(sources: Sequence[str], references: Sequence[str], factors: Sequence[int] = FACTORS
              ) -> dict[int, tuple[list[str], list[str]]]:
    """factor -> (joined sources, joined references), line-aligned."""
    if len(sources) != len(references):
        raise UserError(f"{len(sources)} sources but {len(references)} references")
    return {f: (join_consecutive(sources, f), join_consecutive(references, f)) for f in factors}


def write_long_sets(data_dir: str | Path, out_dir: str | Path, src_lang: str, tgt_lang: str) -> list[Path]:
    """The joined sets as files for other tools: ``<split>.x<f>.<lang>`` (f >= 2)."""
    from rpr_mt.data.prepare import reference_files
    from rpr_mt.lines import read_lines

    written = []
    for split in SPLITS:
        src_path, ref_path = reference_files(data_dir, split)
        for factor, (src, ref) in long_sets(read_lines(src_path), read_lines(ref_path)).items():
            if factor == 1:
                continue
            for lines, lang in ((src, src_lang), (ref, tgt_lang)):
                path = Path(out_dir) / f"{split}.x{factor}.{lang}"
                path.parent.mkdir(parents=True, exist_ok=True)
                write_lines(str(path), lines)
                written.append(path)
    return written


def sets_fingerprint(cfg: Config, factors: Sequence[int], edges: Sequence[int],
                     config_print: Optional[str] = None) -> str:
    """What decides the long sets' scores; ``config_print``: one of ``recorded_fingerprints`` instead of today's."""
    spec = {"config": config_print or config_fingerprint(cfg), "factors": list(factors), "edges": list(edges),
            "decode": comparable_config(cfg)["decode"]}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def corpus_scores(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """sacreBLEU, chrF and the hypothesis/reference length ratio (BLEU's sys_len / ref_len)."""
    bleu = BLEU().corpus_score(hypotheses, [references])
    return {"bleu": bleu.score, "chrf": CHRF().corpus_score(hypotheses, [references]).score,
            "length_ratio": bleu.sys_len / bleu.ref_len if bleu.ref_len else 0.0}


def evaluate_long(
    cfg: Config,
    factors: Sequence[int] = FACTORS,
    edges: Sequence[int] = LENGTH_EDGES,
    log: Callable[[str], None] = print,
    split: bool = False,
) -> dict[str, Any]:
    """Decode and score the original and joined dev/test sets with one finished run (module docstring).

    ``split``: translate each line sentence by sentence (``decode.split_sentences``; what ``rpr-mt translate`` does
    by default) instead of whole, which the study measures. Its hypotheses go to ``long_split/`` and its record to
    ``long_results_split.json``, beside the whole-line ones, which stay as they are."""
    import torch

    from rpr_mt.data.prepare import reference_files
    from rpr_mt.data.vocab import Vocab
    from rpr_mt.decode.translate import translate_lines
    from rpr_mt.lines import read_lines
    from rpr_mt.checkpoint_files import LoadedModel, load_for_inference

    run_dir = Path(cfg.train.run_dir)
    out_path = run_dir / ("long_results_split.json" if split else "long_results.json")
    long_dir = "long_split" if split else "long"
    fingerprint = sets_fingerprint(cfg, factors, edges)
    previous = json.loads(out_path.read_text(encoding="utf-8")) if out_path.is_file() else {}
    if previous.get("fingerprint") in {sets_fingerprint(cfg, factors, edges, config_print)
                                       for config_print in recorded_fingerprints(cfg)}:
        return previous
    # The model is loaded only if a set must be decoded: rescoring hypotheses that are all there (new edges, or a
    # run from results/, whose weights are not kept) needs none.
    @functools.cache
    def loaded_model() -> LoadedModel:
        return load_for_inference(run_dir, "average" if cfg.train.average_last > 1 else "last")

    vocab = Vocab.load(Path(cfg.data.output_dir) / "spm.model")
    decode = dataclasses.replace(cfg.decode, nbest=1, split_sentences=split)
    # Hypothesis files are reused only if they were decoded with today's settings: the sweep's <split>.hyp as its
    # result.json records, those in long/ as long/decode.json does (absent: made with the sweep's, by older code).
    settings = decode_settings(cfg)
    result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    sweep_decode = recorded_decode(result)
    sidecar = run_dir / long_dir / "decode.json"
    if (json.loads(sidecar.read_text(encoding="utf-8")) if sidecar.is_file() else sweep_decode) != settings:
        for stale in sorted(sidecar.parent.glob("*.hyp")):  # made otherwise: none of them is reused
            stale.unlink()
        sidecar.parent.mkdir(parents=True, exist_ok=True)
        write_json(sidecar, settings)
    buckets = buckets_from_edges(list(edges))
    record: dict[str, Any] = {"fingerprint": fingerprint,
                              "checkpoint_file": previous.get("checkpoint_file", result.get("checkpoint_file")),
                              "sets": {}, "buckets": {}, "max_train_tokens": cfg.data.max_train_tokens,
                              "max_positions": cfg.model.max_positions, "decode": settings,
                              **({"split_sentences": True} if split else {})}
    for part in SPLITS:
        src_path, ref_path = reference_files(cfg.data.output_dir, part)
        all_src: list[str] = []
        all_hyp: list[str] = []
        all_ref: list[str] = []
        for factor, (sources, references) in long_sets(read_lines(src_path), read_lines(ref_path), factors).items():
            name = f"{part}.x{factor}"
            # x1: the sweep's own decoding if it was made with today's settings, else one of our own beside the
            # joined sets (the sweep's file stays what its result.json scored)
            own = factor == 1 and sweep_decode == settings and not split
            hyp_path = run_dir / (f"{part}.hyp" if own else f"{long_dir}/{name}.hyp")
            pieces = [len(vocab.encode(line)) for line in sources]
            if hyp_path.is_file() and len(read_lines(hyp_path)) == len(sources):
                hypotheses = read_lines(hyp_path)
            else:
                log(f"{run_dir}: decoding {name} ({len(sources)} inputs, up to {max(pieces)} pieces)")
                loaded = loaded_model()
                record["checkpoint_file"] = loaded.checkpoint.name
                hypotheses = translate_lines(loaded.model, vocab, sources, decode=decode, device=torch.device("cpu"),
                                             src_lang=cfg.data.src_lang, tgt_lang=cfg.data.tgt_lang,
                                             min_length_ratio=loaded.length_ratio_floor)
                hyp_path.parent.mkdir(parents=True, exist_ok=True)
                write_lines(str(hyp_path), hypotheses)
            # what decoding cut: sources past max_positions - 1 pieces are truncated by translate, and the output
            # limit a * |x| + b (|x| with eos, capped at max_positions - 1; decode.search.max_output_lengths) may
            # stop a hypothesis before its eos (counted on the re-encoded output, which SentencePiece gives back
            # as decoded but for rare normalisation differences)
            limit = [min(int(decode.max_len_a * (n + 1) + decode.max_len_b), cfg.model.max_positions - 1)
                     for n in pieces]
            at_limit = sum(len(vocab.encode(h)) >= lim for h, lim in zip(hypotheses, limit))
            record["sets"][name] = {
                **corpus_scores(hypotheses, references), "lines": len(sources),
                "max_source_pieces": max(pieces), "mean_source_words": sum(len(s.split()) for s in sources)
                / len(sources),
                "truncated_sources": sum(n > cfg.model.max_positions - 1 for n in pieces),
                "hypotheses_at_length_limit": at_limit,
            }
            all_src += sources
            all_hyp += hypotheses
            all_ref += references
        record["buckets"][part] = [
            {"bucket": b.label, "low": b.low, "high": b.high, "sentences": count, "bleu": bleu}
            for b, (count, bleu) in zip(buckets, bleu_by_length(all_src, all_hyp, all_ref, buckets))
        ]
    write_json(out_path, record)
    return record


# ----------------------------------------------------------------------------------------------------------------------
# The study's table, plot and paired bootstrap
# ----------------------------------------------------------------------------------------------------------------------

BASELINE = "absolute sinusoidal"  # the row the tok/s column and the bootstrap compare against


def load_long_results(root: str | Path, runs: Sequence[str]) -> dict[str, dict[str, Any]]:
    """run directory -> its long_results.json, for the runs that have one."""
    found = {}
    for run in runs:
        path = Path(root) / run / "long_results.json"
        if path.is_file():
            try:
                found[run] = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError) as exc:  # hand-edited, or cut short by a full disk
                raise UserError(f"{path}: not readable JSON ({exc}); delete it and run the study again to "
                                "rescore the run's long sets") from None
    return found


def _scheme_rows(sweep: Any) -> list[tuple[str, list[str]]]:
    from rpr_mt.experiments.sweep import table_cells

    rows = []
    for cell in table_cells("schemes"):
        results = sweep.cells.get(("schemes", cell.label))
        if results is not None:
            rows.append((cell.label, [r for r in results.runs if r in sweep.results]))
    return rows


def render_study_table(sweep: Any, speeds: dict[str, Any] | None = None) -> str:
    """Markdown: per scheme, mean ± std over the finished seeds of dev and test BLEU, test BLEU at x2, x3, x4,
    the length ratio at x4, training tokens/s relative to the baseline, and the parameter count.

    ``speeds``: the ``cells`` of ``benchmarks/bench_train.py --study --json`` (label -> {"ratio", "range"}), a quiet
    measurement of every cell; without it the column is the runs' own tokens/s against the baseline's mean, which
    measures whatever else ran on the machine during each run."""
    from rpr_mt.experiments.tables import mean_std

    long = load_long_results(sweep.root, list(sweep.results))
    rows = _scheme_rows(sweep)
    base_runs = dict(rows).get(BASELINE, [])
    base_rate = sum(sweep.results[r]["tgt_tok_s"] for r in base_runs) / len(base_runs) if base_runs else None
    lines = ["| scheme | seeds | dev BLEU | test BLEU | test x2 | test x3 | test x4 | length ratio x4 "
             "| tok/s vs absolute | parameters |", "|---|---|---|---|---|---|---|---|---|---|"]
    for label, runs in rows:
        res = [sweep.results[r] for r in runs]
        longs = [long[r] for r in runs if r in long]
        # a finished run whose long sets failed (or are still to come) has none: the seeds column counts it, so the
        # long columns say over how many seeds they are
        fewer = f" ({len(longs)} of {len(res)} seeds)" if longs and len(longs) < len(res) else ""
        cols = [mean_std([x["sets"][f"test.x{f}"]["bleu"] for x in longs]) + fewer if longs else ""
                for f in (2, 3, 4)]
        ratio = mean_std([x["sets"]["test.x4"]["length_ratio"] for x in longs], 3) + fewer if longs else ""
        if speeds is not None:
            measured = speeds.get(label)
            speed = (f"{measured['ratio']:.3f} ({measured['range'][0]:.3f}-{measured['range'][1]:.3f})"
                     if measured else "")
        else:
            speed = mean_std([r["tgt_tok_s"] / base_rate for r in res], 3) if base_rate and res else ""
        params = f"{res[0]['parameters']:,}" if res else ""
        lines.append(f"| {label} | {len(res)}/{len(sweep.cells[('schemes', label)].runs)} "
                     f"| {mean_std([r['dev_bleu'] for r in res]) if res else ''} "
                     f"| {mean_std([r['test_bleu'] for r in res]) if res else ''} | {' | '.join(cols)} | {ratio} "
                     f"| {speed} | {params} |")
    return "\n".join(lines) + "\n"


def bucket_table(sweep: Any, split: str = "test") -> tuple[list[str], list[tuple[str, list[float | None]]]]:
    """(bucket labels, per scheme: mean BLEU over seeds per bucket) from the runs' long_results.json; buckets no
    run's inputs fall in are left out."""
    long = load_long_results(sweep.root, list(sweep.results))
    labels: list[str] = []
    rows = []
    for label, runs in _scheme_rows(sweep):
        per_seed = [long[r]["buckets"][split] for r in runs if r in long]
        if not per_seed:
            continue
        labels = [b["bucket"] for b in per_seed[0]]
        means = []
        for i in range(len(labels)):
            values = [seed[i]["bleu"] for seed in per_seed if seed[i]["bleu"] is not None]
            means.append(sum(values) / len(values) if values else None)
        rows.append((label, means))
    kept = [i for i in range(len(labels)) if any(means[i] is not None for _, means in rows)]  # no empty columns
    return [labels[i] for i in kept], [(label, [means[i] for i in kept]) for label, means in rows]


def render_bucket_table(sweep: Any, split: str = "test") -> str:
    """Markdown: the numbers behind the plot, BLEU per source-length bucket (mean over seeds) per scheme."""
    labels, rows = bucket_table(sweep, split)
    if not rows:
        return ""
    long = load_long_results(sweep.root, list(sweep.results))
    seeds = {label: (sum(r in long for r in runs), len(runs)) for label, runs in _scheme_rows(sweep)}
    lines = ["| scheme | " + " | ".join(f"{split} {label}" for label in labels) + " |",
             "|---|" + "---:|" * len(labels)]
    for label, means in rows:
        have, finished = seeds[label]  # as the study table: a mean over fewer seeds than finished says so
        shown = f"{label} ({have} of {finished} seeds)" if have < finished else label
        lines.append(f"| {shown} | " + " | ".join("-" if m is None else f"{m:.2f}" for m in means) + " |")
    return "\n".join(lines) + "\n"


def plot_study(sweep: Any, out_path: str | Path, split: str = "test") -> Path:
    """BLEU against source length (buckets over the original and joined sets) per scheme, as a PNG."""
    from rpr_mt.plotting import pyplot

    plt = pyplot()
    labels, rows = bucket_table(sweep, split)
    if not rows:
        raise UserError(f"no run under {sweep.root} has long_results.json yet")
    fig, ax = plt.subplots(figsize=(9, 5))
    for label, means in rows:
        xs = [i for i, m in enumerate(means) if m is not None]
        ax.plot(xs, [means[i] for i in xs], marker="o", label=label)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlabel(f"source length in words ({split}, original and x2-x4 joined sentences)")
    ax.set_ylabel("sacreBLEU (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return out_path


def render_bootstrap(sweep: Any, split: str = "test", factors: Sequence[int] = (1, 4),
                     data_dir: str | Path | None = None, baseline: str = BASELINE) -> str:
    """Markdown: each scheme minus the ``baseline`` scheme of the same seed, per set, with the paired bootstrap
    p-value; without a finished baseline run, a line that says so (a study still training is reported as far as it
    goes, the sections after this one too, as aggregate.py does).

    The references come from ``data_dir``, by default the prepared data named by the baseline run's config."""
    from rpr_mt.data.prepare import reference_files
    from rpr_mt.lines import read_lines
    from rpr_mt.experiments.outputs import _run_data_dir
    from rpr_mt.experiments.significance import paired_bootstrap

    rows = _scheme_rows(sweep)
    labels = [label for label, _ in rows]
    if baseline not in labels:
        raise UserError(f"--baseline {baseline!r} is not a scheme of this study (one of: {', '.join(labels)})")
    base = {sweep.entries[r]["seed"]: r for r in dict(rows)[baseline]}
    if not base:
        return f"No paired bootstrap: no '{baseline}' run has finished yet to compare with.\n"
    if data_dir is None:
        data_dir = _run_data_dir(sweep.root / next(iter(base.values())))
    src_path, ref_path = reference_files(data_dir, split)
    sets = long_sets(read_lines(src_path), read_lines(ref_path), factors)
    lines = ["| scheme | " + " | ".join(f"Δ {split} x{f} BLEU vs {baseline} (p per seed)" for f in factors) + " |",
             "|---|" + "---|" * len(factors)]
    for label, runs in rows:
        if label == baseline or not runs:  # no finished run yet: no row
            continue
        cells = []
        for factor in factors:
            name = f"{split}.x{factor}"
            parts = []
            for run in runs:
                seed = sweep.entries[run]["seed"]
                if seed not in base:
                    continue
                hyps = [_hypotheses(sweep.root / r, name) for r in (base[seed], run)]
                if None in hyps:
                    continue
                delta, p = paired_bootstrap(hyps[0], hyps[1], sets[factor][1])
                parts.append(f"{delta:+.2f} (p={p:.3f})")
            cells.append(", ".join(parts))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_output_lengths(sweep: Any, split: str = "test", factor: int = 4,
                          data_dir: str | Path | None = None) -> str:
    """Markdown: per scheme, the length of its hypotheses for the x``factor`` set in SentencePiece pieces (median and
    mean over hypotheses, averaged over seeds) and the share longer than the training cap (data.max_train_tokens),
    against the references'. Outputs no longer than the training targets, whatever the input, are a model that
    learned output length rather than to translate what it is given."""
    import statistics

    import numpy as np

    from rpr_mt.config import load_config
    from rpr_mt.data.binarize import load_split
    from rpr_mt.data.prepare import reference_files
    from rpr_mt.data.vocab import Vocab
    from rpr_mt.lines import read_lines
    from rpr_mt.experiments.outputs import _run_data_dir
    from rpr_mt.train.batching import usable_examples

    rows = [(label, runs) for label, runs in _scheme_rows(sweep) if runs]
    if not rows:
        raise UserError(f"no finished run under {sweep.root}")
    first = sweep.root / rows[0][1][0]
    data_dir = Path(data_dir) if data_dir is not None else _run_data_dir(first)
    config = load_config(first / "config.yaml", user_given=False)  # a run's saved config: see _run_data_dir
    cap = config.data.max_train_tokens
    vocab = Vocab.load(data_dir)
    _, ref_path = reference_files(data_dir, split)
    references = join_consecutive(read_lines(ref_path), factor)
    name = f"{split}.x{factor}"
    train = load_split(data_dir, "train")
    kept = usable_examples(train, config.model.max_positions, cap)
    trained = [int(n) for n in np.asarray(train.tgt_lengths)[kept]]

    def pieces(lines: list[str]) -> list[int]:
        return [len(ids) for ids in vocab.encode_batch(lines)]

    def stats(lengths: list[int]) -> tuple[float, float, float | None]:
        over = None if cap is None else sum(n > cap for n in lengths) / len(lengths)
        return statistics.median(lengths), statistics.fmean(lengths), over

    def cells(values: list[tuple[float, float, float | None]]) -> str:
        median, mean = (statistics.fmean(v[i] for v in values) for i in (0, 1))
        overs = [v[2] for v in values if v[2] is not None]
        return f"{median:.1f} | {mean:.1f} | " + (f"{100 * statistics.fmean(overs):.0f}%" if overs else "-")

    cap_text = f"> {cap} pieces (the training cap)" if cap is not None else "over the cap (none set)"
    lines = [f"| {name} | seeds | pieces, median | pieces, mean | {cap_text} |", "|---|---|---:|---:|---:|",
             f"| training targets the models saw | - | {cells([stats(trained)])} |",
             f"| references | - | {cells([stats(pieces(references))])} |"]
    for label, runs in rows:
        found = [h for h in (_hypotheses(sweep.root / run, name) for run in runs) if h is not None]
        if found:
            lines.append(f"| {label} | {len(found)} | {cells([stats(pieces(h)) for h in found])} |")
    return "\n".join(lines) + "\n"


def _hypotheses(run_dir: Path, name: str) -> list[str] | None:
    from rpr_mt.lines import read_lines

    split, factor = name.split(".x")
    path = run_dir / f"long/{name}.hyp"  # x1: evaluate_long's own decoding where it made one, else the sweep's
    if factor == "1" and not path.is_file():
        path = run_dir / f"{split}.hyp"
    return read_lines(path) if path.is_file() else None
