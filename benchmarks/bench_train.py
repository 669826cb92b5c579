"""Training throughput of each position scheme against absolute positions on this machine.

Runs real training updates (forward, label-smoothed loss, backward, Adam) of the same model with each scheme of
``--schemes`` (default ``absolute`` and ``relative``: k=16, aK+aV, per-head tables; ``all``: every scheme) on
length-bucketed batches drawn from two length regimes, in fp32 and bf16 autocast, and prints target tokens/s
(medians over repeats) and each scheme's ratio to absolute (the median of the ratios of each repeat's back-to-back
measurements, and their range).

    python3 benchmarks/bench_train.py                       # d_model 256, 3+3 layers, ~4k target tokens a batch
    python3 benchmarks/bench_train.py --schemes all --regimes multi30k --precisions fp32
    python3 benchmarks/bench_train.py --regimes wmt --precisions bf16 --updates 10
    python3 benchmarks/bench_train.py --malloc default   # without rpr_mt.host.keep_freed_memory (glibc's default)
    python3 benchmarks/bench_train.py --study configs/multi30k_en_de_positions.yaml --json results/study_speed.json
        # every cell of the position-scheme study (sweep table "schemes") with the study config's model and
        # batch size, fp32, Multi30k lengths: the study table's "tok/s vs absolute" column (scripts/study_positions.py
        # --report --speed-json), measured quietly instead of read from runs that shared the machine

Regimes (token counts per sentence, target side; source similar):
    multi30k  lengths from the real Multi30k train split when ../shared is present (pieces ~ 1.25 x words),
              else a normal(16, 5) clipped to [4, 60]
    wmt       20-100 tokens, mean ~30 (a gamma distribution shifted to 20), as WMT14 after BPE
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import sys
import time
import typing
from pathlib import Path

import numpy as np
import torch

from rpr_mt.config import ModelConfig
from rpr_mt.host import keep_freed_memory
from rpr_mt.model.transformer import Seq2Seq
from rpr_mt.train.batching import collate, make_batches
from rpr_mt.train.device import autocast
from rpr_mt.train.loss import TranslationLoss

sys.path.insert(0, str(Path(__file__).resolve().parent))  # arguments.py, beside this file
from arguments import (  # noqa: E402
    ArgumentParser, at_least, non_negative_int, positive_int, probability, reports_user_errors,
)

SCHEMES = list(typing.get_args(typing.get_type_hints(ModelConfig)["positions"]))
MULTI30K = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "multi30k" / "train.de.gz"


class SyntheticIds:
    """Random token ids with given lengths (the ParallelIds protocol the batcher reads)."""

    def __init__(self, src_lengths: np.ndarray, tgt_lengths: np.ndarray, vocab: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.src_lengths, self.tgt_lengths = src_lengths, tgt_lengths
        self._src = [rng.integers(4, vocab, n).astype(np.int32) for n in src_lengths]
        self._tgt = [rng.integers(4, vocab, n).astype(np.int32) for n in tgt_lengths]

    def __len__(self) -> int:
        return len(self.src_lengths)

    def src(self, i: int) -> np.ndarray:
        return self._src[i]

    def tgt(self, i: int) -> np.ndarray:
        return self._tgt[i]


def lengths(regime: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if regime == "multi30k":
        if MULTI30K.is_file():
            with gzip.open(MULTI30K, "rt", encoding="utf-8") as handle:
                words = np.array([len(line.split()) for line in handle])
            tgt = np.maximum(1, np.round(rng.choice(words, n) * 1.25)).astype(int)
        else:
            tgt = np.clip(rng.normal(16, 5, n), 4, 60).astype(int)
    elif regime == "wmt":
        tgt = np.clip(20 + rng.gamma(2.0, 5.0, n), 20, 100).astype(int)
    else:
        raise ValueError(regime)
    src = np.maximum(1, (tgt * rng.uniform(0.8, 1.2, n)).astype(int))
    return src, tgt


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model and batch size options (defaults: the time-to-BLEU model, 4,096-token batches)."""
    parser.add_argument("--d-model", type=positive_int, default=256)
    parser.add_argument("--heads", type=positive_int, default=4)
    parser.add_argument("--layers", type=positive_int, default=3)
    parser.add_argument("--ff", type=positive_int, default=1024)
    parser.add_argument("--vocab", type=at_least(16), default=8000)
    parser.add_argument("--max-tokens", type=positive_int, default=4096)
    parser.add_argument("--attention-dropout", type=probability, default=0.1,
                        help="0.1 as in the OpenNMT-py peer setup")


def training_module(positions: str, args) -> tuple[Seq2Seq, TranslationLoss]:
    """The model (k = 16, aK + aV, per-head tables when relative; dropout 0.1) and its label-smoothed loss."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=args.d_model, n_heads=args.heads, encoder_layers=args.layers, decoder_layers=args.layers,
                      ff_dim=args.ff, dropout=0.1, attention_dropout=args.attention_dropout, positions=positions,
                      clip=16, max_positions=256)
    model = Seq2Seq(cfg, args.vocab)
    return model, TranslationLoss(model, 0.1).train()


def measure(positions: str | ModelConfig, precision: str, data: SyntheticIds, args) -> float:
    """Target tokens/s of ``args.updates`` timed updates of the scheme ``positions`` (the model of the options) or of
    a whole model section."""
    if isinstance(positions, ModelConfig):
        torch.manual_seed(0)
        model = Seq2Seq(positions, args.vocab)
        module = TranslationLoss(model, 0.1).train()
    else:
        model, module = training_module(positions, args)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
    batches = make_batches(data, np.arange(len(data)), args.max_tokens, seed=1, epoch=0)
    device = torch.device("cpu")
    times, tokens = [], []
    for i in range(args.warmup + args.updates):
        batch = collate(data, batches[i % len(batches)], 0, 2, 3)
        start = time.perf_counter()
        with autocast(device, precision):
            loss, _ = module(batch.src, batch.tgt_in, batch.tgt_out)
        (loss / batch.global_tgt_tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
            tokens.append(batch.global_tgt_tokens)
    return sum(tokens) / sum(times)


@reports_user_errors
def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--regimes", nargs="+", choices=["multi30k", "wmt"], default=["multi30k", "wmt"])
    parser.add_argument("--precisions", nargs="+", choices=["fp32", "bf16", "fp16"], default=["fp32", "bf16"])
    add_model_arguments(parser)
    parser.add_argument("--updates", type=positive_int, default=20)
    parser.add_argument("--warmup", type=non_negative_int, default=3)
    parser.add_argument("--repeats", type=positive_int, default=3,
                        help="alternating measurements of the schemes; median reported")
    parser.add_argument("--schemes", nargs="+", default=["relative"], choices=SCHEMES + ["all"],
                        help="schemes measured beside absolute (all: every model.positions choice)")
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--malloc", choices=["keep", "default"], default="keep",
                        help="keep: as `rpr-mt train` does on CPU (rpr_mt.host.keep_freed_memory); default: glibc's")
    parser.add_argument("--study", metavar="CONFIG",
                        help="measure the cells of the study table 'schemes' with this config's model and max_tokens")
    parser.add_argument("--json", metavar="FILE", help="with --study: also write the ratios here")
    args = parser.parse_args(argv)
    if args.study:  # a bad --study config is refused before any measurement
        from rpr_mt.config import load_config

        load_config(args.study)
    torch.set_num_threads(args.threads)
    if args.malloc == "keep":
        keep_freed_memory()
    rng = np.random.default_rng(0)
    print(f"torch {torch.__version__}, {args.threads} threads; model d={args.d_model}, {args.layers}+{args.layers} "
          f"layers, {args.heads} heads, ff {args.ff}, vocab {args.vocab}, attention dropout {args.attention_dropout}; batches <= {args.max_tokens} tokens a side; "
          f"{args.updates} timed updates after {args.warmup} warm-up, median of {args.repeats} alternating repeats; "
          f"malloc {args.malloc}\n")
    if args.study:
        study(args, rng)
        return
    schemes = SCHEMES if args.schemes == ["all"] else list(dict.fromkeys(["absolute", *args.schemes]))
    print("| regime | precision | scheme | tgt tok/s | / absolute | range |")
    print("|---|---|---|---:|---:|---|")
    for regime in args.regimes:
        src, tgt = lengths(regime, 6000, rng)
        data = SyntheticIds(src, tgt, args.vocab)
        for precision in args.precisions:
            results: dict[str, list[float]] = {positions: [] for positions in schemes}
            for _ in range(args.repeats):  # alternate so that machine noise hits every scheme alike
                for positions in results:
                    results[positions].append(measure(positions, precision, data, args))
            for positions, rates in results.items():
                # the ratio within each repeat (measured back to back), then the median: the machine's speed drifts
                ratios = [r / a for r, a in zip(rates, results["absolute"])]
                print(f"| {regime} | {precision} | {positions} | {statistics.median(rates):,.0f} "
                      f"| {statistics.median(ratios):.3f} | {min(ratios):.3f}-{max(ratios):.3f} |", flush=True)


def study(args, rng: np.random.Generator) -> None:
    """Each cell of the study table against its baseline cell, alternating, in fp32 on Multi30k lengths."""
    import json

    from rpr_mt.config import load_config
    from rpr_mt.experiments.study import BASELINE
    from rpr_mt.experiments.sweep import table_cells

    cells = {cell.label: load_config(args.study, list(cell.overrides)) for cell in table_cells("schemes")}
    args.max_tokens = next(iter(cells.values())).train.max_tokens
    args.vocab = next(iter(cells.values())).data.vocab_size
    src, tgt = lengths("multi30k", 6000, rng)
    data = SyntheticIds(src, tgt, args.vocab)
    rates: dict[str, list[float]] = {label: [] for label in cells}
    for _ in range(args.repeats):  # alternate so that machine noise hits every cell alike
        for label, cfg in cells.items():
            rates[label].append(measure(cfg.model, "fp32", data, args))
    print(f"study cells of {args.study} (max_tokens {args.max_tokens}, fp32, Multi30k lengths)\n")
    print(f"| cell | tgt tok/s | / {BASELINE} | range |")
    print("|---|---:|---:|---|")
    result = {}
    for label, values in rates.items():
        ratios = [r / b for r, b in zip(values, rates[BASELINE])]
        result[label] = {"tgt_tok_s": statistics.median(values), "ratio": statistics.median(ratios),
                         "range": [min(ratios), max(ratios)]}
        print(f"| {label} | {statistics.median(values):,.0f} | {statistics.median(ratios):.3f} "
              f"| {min(ratios):.3f}-{max(ratios):.3f} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"config": args.study, "repeats": args.repeats, "updates": args.updates,
                                               "threads": args.threads, "cells": result}, indent=1) + "\n")


if __name__ == "__main__":
    main()
