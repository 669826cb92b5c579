"""Training throughput and peak memory on a GPU: the paper's base (and big) model with relative positions against
the same model with absolute positions, in bf16 autocast, on WMT-shaped batches.

Runs real training updates (forward, label-smoothed loss, backward, fused Adam) of each configuration on
length-bucketed batches of synthetic WMT14-like sentences (20-100 tokens, mean ~30: ``bench_train.lengths("wmt")``)
and prints target tokens/s (the median over --repeats alternating measurements), the ratio to absolute (the median
of each repeat's back-to-back ratios) and the peak of torch.cuda.max_memory_allocated during the timed updates.
The last column counts the Triton kernel variants compiled during the timed updates, summed over the repeats: a
compilation there is a shape or specialization the warm-up did not meet, and its seconds are in the rate.
The warm-up replays the timed batches first: a batch shape met for the first time costs far more on a GPU (cuBLAS
heuristics, allocator growth, Triton specializations) than it does again, and timing first meetings made the first
H200 measurement swing by 2x between repeats (a trainer meets its shapes again every epoch).

Configurations (``--schemes``):
    absolute         sinusoidal positions (the paper's baseline)
    relative-torch   Shaw et al.'s tables (base: k = 16 per head; big: k = 8 shared), every self-attention call on
                     the chunked torch path (impl="fused"; the CUDA default where Triton is not installed)
    relative-triton  the same model on the fused Triton kernels (impl="triton"; the CUDA default with Triton)
    relative-triton-tiles  the same with the kernel tiles of --tiles (RPR_MT_TRITON_TILES while it runs; from
                     benchmarks/tune_gpu_attention.py), measured beside the default tiles
    relative-triton-serial  the Triton kernels with the one-program-per-(batch, head) backward pass
                     (RPR_MT_TRITON_BACKWARD=serial while it runs; triton_shaw.backward_variant); the other Triton
                     schemes take RPR_MT_TRITON_BACKWARD as the caller set it

Batches: --max-tokens per batch, each a value to measure; 3,125 is one GPU's share of the paper's 25,000-token
update on 8 GPUs (max_tokens 25,000, update_freq 1 under torchrun), 25,000 the whole update on one GPU.

    python3 benchmarks/bench_gpu_train.py                                       # base, 3,125 and 25,000 tokens
    python3 benchmarks/bench_gpu_train.py --presets base big --max-tokens 3125 --json train.json
    python3 benchmarks/bench_gpu_train.py --dry-run                             # the table's form, no GPU needed
    python3 benchmarks/bench_gpu_train.py --max-tokens 3125 --profile prof/     # where an update's time goes

With --profile, the first repeat of each row profiles a few more updates: the kernels' device time against the wall
clock says whether the GPU waits for the host (a small batch's update on an H100), and the operator tables say for
what.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # arguments.py, bench_train.py, beside this file
from arguments import ArgumentParser, at_least, non_negative_int, positive_int, reports_user_errors  # noqa: E402

COLUMNS = ["model", "tokens/batch", "scheme", "tgt tok/s", "/ absolute", "peak MiB", "/ absolute",
           "compiles (timed)"]
SCHEMES = ["absolute", "relative-torch", "relative-triton", "relative-triton-tiles", "relative-triton-serial"]
IMPLS = {"relative-torch": "fused", "relative-triton": "triton", "relative-triton-tiles": "triton",
         "relative-triton-serial": "triton"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", choices=["base", "big"], default=["base"])
    parser.add_argument("--max-tokens", type=positive_int, nargs="+", default=[3125, 25000])
    parser.add_argument("--schemes", nargs="+", choices=SCHEMES, default=SCHEMES[:3])
    parser.add_argument("--tiles", default="", help="RPR_MT_TRITON_TILES of the relative-triton-tiles scheme (on a "
                        "GPU; the interpreter keeps its own tiles)")
    parser.add_argument("--precision", choices=["bf16", "fp16", "fp32"], default="bf16")
    parser.add_argument("--vocab", type=at_least(16), default=32768)
    parser.add_argument("--updates", type=positive_int, default=20)
    parser.add_argument("--warmup", type=non_negative_int, default=20,
                        help="untimed updates first, replaying the timed batches")
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: a smoke test of this script (with --tiny; the Triton rows need TRITON_INTERPRET=1)")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer d_model 32 model instead of the presets")
    parser.add_argument("--json", default=None, help="also write the rows as JSON to this file")
    parser.add_argument("--profile", default=None, metavar="DIR",
                        help="after the first repeat's timed updates of each row, profile --profile-updates more "
                        "(torch.profiler) and write DIR/<model>_<tokens>_<scheme>.txt: GPU-busy share of the wall "
                        "clock, top operators by device and by host time")
    parser.add_argument("--profile-updates", type=positive_int, default=5)
    parser.add_argument("--dry-run", action="store_true", help="print the table's form without measuring")
    return parser.parse_args(argv)


def format_row(values: list[object]) -> str:
    return "| " + " | ".join(str(v) for v in values) + " |"


def header() -> str:
    return format_row(COLUMNS) + "\n" + format_row([":---", "---:", ":---", "---:", "---:", "---:", "---:", "---:"])


def table_row(row: dict) -> str:
    def number(key: str, spec: str) -> str:
        return "-" if row.get(key) is None else format(row[key], spec)

    return format_row([row["model"], f"{row['max_tokens']:,}", row["scheme"], number("tokens_per_s", ",.0f"),
                       number("ratio", ".3f"), number("peak_mib", ",.0f"), number("memory_ratio", ".3f"),
                       number("timed_compiles", "d")])


def build(preset: str, scheme: str, args: argparse.Namespace):
    from rpr_mt.config import config_from_dict
    from rpr_mt.model.transformer import Seq2Seq
    from rpr_mt.train.loss import TranslationLoss

    raw = {"preset": preset, "positions": "absolute" if scheme == "absolute" else "relative", "max_positions": 256}
    if args.tiny:
        raw.update(d_model=32, n_heads=2, encoder_layers=1, decoder_layers=1, ff_dim=64)
    cfg = config_from_dict({"model": raw}).model
    torch.manual_seed(0)
    model = Seq2Seq(cfg, args.vocab).to(args.device)
    return model, TranslationLoss(model, 0.1).train()


@contextlib.contextmanager
def _environ(**values: str | None) -> Iterator[None]:
    """The environment variables of ``values`` set (None: unset) while it runs, then each as it was."""
    import os

    saved = {name: os.environ.get(name) for name in values}
    try:
        for name, value in values.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


@contextlib.contextmanager
def attention_impl(scheme: str, tiles: str = ""):
    """The relative schemes: every Shaw self-attention call with the scheme's impl, whatever the default policy;
    relative-triton-tiles with RPR_MT_TRITON_TILES=tiles while it runs (relative-triton without it),
    relative-triton-serial with RPR_MT_TRITON_BACKWARD=serial (the others with the caller's)."""
    if scheme not in IMPLS:
        yield
        return
    import rpr_mt.model.positions.shaw as shaw

    settings = {"RPR_MT_TRITON_TILES": tiles if scheme == "relative-triton-tiles" else None}
    if scheme == "relative-triton-serial":
        settings["RPR_MT_TRITON_BACKWARD"] = "serial"
    original = shaw.relative_attention
    shaw.relative_attention = functools.partial(original, impl=IMPLS[scheme])
    try:
        with _environ(**settings):
            yield
    finally:
        shaw.relative_attention = original


def batch_order(n_batches: int, warmup: int, updates: int) -> list[int]:
    """Indices of the batches of ``warmup`` untimed then ``updates`` timed updates: the timed ones are the first
    ``updates`` batches (cycled), and the warm-up replays them, so each timed shape has been met before once
    ``warmup >= updates``."""
    if n_batches < 1 or updates < 1:
        raise ValueError(f"need at least one batch and one timed update, got {n_batches} and {updates}")
    timed = [i % n_batches for i in range(updates)]
    return [timed[i % len(timed)] for i in range(warmup)] + timed


def triton_variants() -> int | None:
    """Variants of the Triton attention kernels compiled so far (None when the module or the count is unavailable)."""
    try:
        from rpr_mt.model.kernels import triton_shaw
    except Exception:
        return None
    return triton_shaw.compiled_variants()


def profile_updates(update, count: int, cuda: bool, path: Path, title: str) -> dict:
    """torch.profiler over ``count`` calls of ``update``: the wall clock per update, the device time its kernels
    took (their sum: where it is well below the wall clock, the GPU waits for the host), and the operators with the
    most device and host time, written to ``path``."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(count):
            update()
        if cuda:
            torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / count
    averages = prof.key_averages()

    def device_us(event) -> float:
        return getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0.0)) or 0.0

    device = sum(device_us(e) for e in averages) / count / 1e3  # ms per update
    summary = {"wall_ms": wall * 1e3, "device_ms": device if cuda else None,
               "device_busy": device / (wall * 1e3) if cuda and wall > 0 else None}
    lines = [f"# {title}: {count} profiled updates", f"wall {summary['wall_ms']:.2f} ms per update"
             + (f", device kernels {device:.2f} ms ({summary['device_busy']:.0%} busy)" if cuda else ""), ""]
    for keys in ([("self_device_time_total", "self_cuda_time_total")] if cuda else []) + [("self_cpu_time_total",)]:
        for key in keys:  # the device key's name changed in torch 2.4; the older one stays accepted for now
            try:
                lines += [f"## by {key}", averages.table(sort_by=key, row_limit=30), ""]
                break
            except (AttributeError, KeyError, ValueError):
                continue
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines), encoding="utf-8")
    return summary


def measure(
    preset: str, scheme: str, max_tokens: int, data, args: argparse.Namespace, profile_path: Path | None = None
) -> tuple[float, float | None, int | None]:
    """(target tokens/s, peak MiB, Triton kernel variants compiled during the timed updates: None for the torch
    schemes or where unknown) of --updates timed training updates after --warmup."""
    from rpr_mt.train.batching import collate, make_batches
    from rpr_mt.train.device import autocast

    device = torch.device(args.device)
    model, module = build(preset, scheme, args)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9,
                                 fused=device.type == "cuda")
    batches = make_batches(data, np.arange(len(data)), max_tokens, seed=1, epoch=0)
    cuda = device.type == "cuda"
    tokens, start, variants = 0, 0.0, None

    def update(index: int) -> int:
        batch = collate(data, batches[index], 0, 2, 3).to(device)
        with autocast(device, args.precision):
            loss, _ = module(batch.src, batch.tgt_in, batch.tgt_out)
        (loss / batch.global_tgt_tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return batch.global_tgt_tokens

    order = batch_order(len(batches), args.warmup, args.updates)
    with attention_impl(scheme, args.tiles):
        for i, index in enumerate(order):
            if i == args.warmup:
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                start = time.perf_counter()
                variants = triton_variants()
            done = update(index)
            if i >= args.warmup:
                tokens += done
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        after = triton_variants()
        if profile_path is not None:  # the timed batches again: shapes met before, nothing compiled
            replay = iter(order[args.warmup:] * (args.profile_updates // max(1, args.updates) + 1))
            summary = profile_updates(lambda: update(next(replay)), args.profile_updates, cuda, profile_path,
                                      f"{preset}, {max_tokens:,} tokens, {scheme}")
            busy = "" if summary["device_busy"] is None else (f", device kernels {summary['device_ms']:.2f} ms "
                                                              f"({summary['device_busy']:.0%} busy)")
            print(f"profile of {scheme} at {max_tokens:,} tokens: wall {summary['wall_ms']:.2f} ms per update{busy}"
                  f" -> {profile_path}", file=sys.stderr, flush=True)
    kernels = IMPLS.get(scheme) == "triton" and None not in (variants, after)
    compiles = after - variants if kernels else None
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    del model, module, optimizer
    if cuda:
        torch.cuda.empty_cache()
    return tokens / seconds, peak, compiles


def write_json(path: str, args: argparse.Namespace, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"setup": describe(args), "rows": rows}, handle, indent=1)


def run(args: argparse.Namespace) -> list[dict]:
    """Measure every row; with --json the file is rewritten after each, so a run cut off keeps its rows."""
    from bench_train import SyntheticIds, lengths

    rng = np.random.default_rng(0)
    src, tgt = lengths("wmt", 20000 if not args.tiny else 400, rng)
    data = SyntheticIds(src, tgt, args.vocab)
    schemes = list(dict.fromkeys(["absolute", *args.schemes]))
    rows = []
    for preset in args.presets:
        for max_tokens in args.max_tokens:
            rates: dict[str, list[float]] = {s: [] for s in schemes}
            peaks: dict[str, float | None] = {}
            compiles: dict[str, list[int]] = {s: [] for s in schemes}
            for repeat in range(args.repeats):  # alternate, so that drifts of the machine hit every scheme alike
                for scheme in schemes:
                    model_name = preset if not args.tiny else "tiny"
                    profile_path = (Path(args.profile) / f"{model_name}_{max_tokens}_{scheme}.txt"
                                    if args.profile and repeat == 0 else None)
                    rate, peak, compiled = measure(preset, scheme, max_tokens, data, args, profile_path)
                    rates[scheme].append(rate)
                    if compiled is not None:
                        compiles[scheme].append(compiled)
                    peaks[scheme] = peak if peaks.get(scheme) is None else max(peaks[scheme], peak or 0)
            for scheme in schemes:
                ratios = [r / a for r, a in zip(rates[scheme], rates["absolute"])]
                row = {"model": preset if not args.tiny else "tiny", "max_tokens": max_tokens, "scheme": scheme,
                       "tokens_per_s": statistics.median(rates[scheme]), "ratio": statistics.median(ratios),
                       "peak_mib": peaks[scheme],
                       "memory_ratio": None if peaks[scheme] is None else peaks[scheme] / peaks["absolute"],
                       "timed_compiles": sum(compiles[scheme]) if compiles[scheme] else None}
                rows.append(row)
                print(table_row(row), flush=True)
                if args.json:
                    write_json(args.json, args, rows)
    return rows


def describe(args: argparse.Namespace) -> str:
    name = torch.cuda.get_device_name() if args.device == "cuda" and torch.cuda.is_available() else args.device
    return (f"# training on {name}: {args.precision}, vocab {args.vocab}, WMT-like lengths, {args.updates} timed "
            f"updates after {args.warmup} replaying them, median of {args.repeats} alternating repeats, "
            f"torch {torch.__version__}" + (f", tiles {args.tiles}" if args.tiles else ""))


@reports_user_errors
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if ("relative-triton-tiles" in args.schemes) != bool(args.tiles):
        print("--tiles and the relative-triton-tiles scheme go together", file=sys.stderr)
        return 2
    if args.tiles:
        from rpr_mt.model.kernels.triton_shaw import parse_tiles

        try:
            parse_tiles(args.tiles)
        except ValueError as error:
            print(f"--tiles: {error}", file=sys.stderr)
            return 2
    print(describe(args))
    print(header())
    if args.dry_run:
        rows = [{"model": p, "max_tokens": t, "scheme": s} for p in args.presets for t in args.max_tokens
                for s in dict.fromkeys(["absolute", *args.schemes])]
        for row in rows:
            print(table_row(row))
    else:
        if args.device == "cuda" and not torch.cuda.is_available():
            print("no CUDA device: nothing measured (--dry-run prints the table's form)", file=sys.stderr)
            return 2
        rows = run(args)
    if args.json:
        write_json(args.json, args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
