"""How close a training update comes to this CPU's matrix-multiply speed, and the throughput that speed allows.

Counts the floating-point operations of real training updates (forward, label-smoothed loss, backward) with
``torch.utils.flop_counter`` (matrix products only: everything else is a small share of the arithmetic), times the
same updates with the Adam step, measures the best fp32 matmul rate at the model's own GEMM shapes, and prints:

- FLOPs per target token, the achieved GFLOP/s and its share of the matmul rate;
- the ceiling: target tokens/s if every update ran all its FLOPs at that matmul rate and nothing else cost time;
- where the time goes: the profiler's self time of matrix products against everything else, by operator.

    python3 benchmarks/bench_roofline.py                          # the time-to-BLEU model, Multi30k lengths
    python3 benchmarks/bench_roofline.py --positions absolute --goal 2950

The model and batches are bench_train's (d_model 256, 3+3 layers, ff 1024, vocabulary 8,000, <= 4,096 tokens).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from rpr_mt.host import keep_freed_memory
from rpr_mt.train.batching import collate, make_batches

sys.path.insert(0, str(Path(__file__).resolve().parent))  # arguments.py, bench_train.py, beside this file
from arguments import ArgumentParser, non_negative_int, positive_float, positive_int, reports_user_errors  # noqa: E402
from bench_train import SyntheticIds, add_model_arguments, lengths, training_module  # noqa: E402

MATMUL_OPS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::matmul", "aten::linear")


def matmul_rate(shapes: list[tuple[int, int, int]], repeats: int) -> dict[tuple[int, int, int], float]:
    """Best GFLOP/s of ``[m, k] @ [k, n]`` for each shape (fp32, preallocated output)."""
    rates = {}
    for m, k, n in shapes:
        a, b, out = torch.randn(m, k), torch.randn(k, n), torch.empty(m, n)
        for _ in range(3):
            torch.mm(a, b, out=out)
        best = min(_timed(lambda: torch.mm(a, b, out=out)) for _ in range(repeats))
        rates[(m, k, n)] = 2 * m * k * n / best / 1e9
    return rates


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@reports_user_errors
def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--positions", default="relative", choices=["relative", "absolute"])
    add_model_arguments(parser)
    parser.add_argument("--updates", type=positive_int, default=20)
    parser.add_argument("--warmup", type=non_negative_int, default=3)
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--goal", type=positive_float, default=2950.0,
                        help="target tokens/s to compare with the ceiling")
    parser.add_argument("--top", type=positive_int, default=12, help="operators listed in the time breakdown")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    keep_freed_memory()

    src, tgt = lengths("multi30k", 6000, np.random.default_rng(0))
    data = SyntheticIds(src, tgt, args.vocab)
    batches = make_batches(data, np.arange(len(data)), args.max_tokens, seed=1, epoch=0)
    model, module = training_module(args.positions, args)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)

    def update(batch) -> None:
        loss, _ = module(batch.src, batch.tgt_in, batch.tgt_out)
        (loss / batch.global_tgt_tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    timed = [collate(data, batches[i % len(batches)], 0, 2, 3) for i in range(args.warmup + args.updates)]
    for batch in timed[: args.warmup]:
        update(batch)
    seconds, tokens, flops = 0.0, 0, 0
    for batch in timed[args.warmup:]:
        seconds += _timed(lambda: update(batch))
        tokens += batch.global_tgt_tokens
    for batch in timed[args.warmup:]:  # counted apart from the timing: the counter slows every operator
        counter = FlopCounterMode(display=False)
        with counter:
            update(batch)
        flops += counter.get_total_flops()

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for batch in timed[args.warmup: args.warmup + 5]:
            update(batch)
    self_us: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        self_us[event.key] += event.self_cpu_time_total
    total_us = sum(self_us.values())
    matmul_us = sum(v for k, v in self_us.items() if k in MATMUL_OPS)

    tokens_per_batch = statistics.mean(b.src.numel() for b in timed)
    m = int(round(tokens_per_batch / 256)) * 256  # the GEMMs' row count: the batch's padded token count
    d, f, v = args.d_model, args.ff, args.vocab
    rates = matmul_rate([(m, d, d), (m, d, f), (m, f, d), (m, d, v), (m, v, d), (v, m, d), (2048, 2048, 2048)], 5)
    peak = max(rates.values())

    per_token = flops / tokens
    achieved = flops / seconds / 1e9
    print(f"torch {torch.__version__}, {args.threads} threads; {args.positions} model d={d}, {args.layers}+{args.layers}"
          f" layers, ff {f}, vocabulary {v}; {args.updates} timed updates (batches <= {args.max_tokens} tokens)\n")
    print("| GEMM [m, k] @ [k, n] | GFLOP/s |")
    print("|---|---|")
    for (mm, kk, nn), rate in rates.items():
        print(f"| [{mm}, {kk}] @ [{kk}, {nn}] | {rate:.1f} |")
    print()
    print(f"matrix-product FLOPs per target token (forward + backward): {per_token / 1e6:.1f} M")
    print(f"measured: {tokens / seconds:,.0f} target tokens/s = {achieved:.1f} GFLOP/s "
          f"= {achieved / peak:.0%} of the best matmul rate ({peak:.1f} GFLOP/s)")
    ceiling = peak * 1e9 / per_token
    print(f"ceiling at the best matmul rate: {ceiling:,.0f} target tokens/s "
          f"(measured / ceiling = {tokens / seconds / ceiling:.2f})")
    print(f"goal {args.goal:,.0f} target tokens/s needs {args.goal * per_token / 1e9:.1f} GFLOP/s "
          f"= {args.goal * per_token / 1e9 / peak:.0%} of the best matmul rate\n")
    print(f"profiler self time over 5 updates: matrix products {matmul_us / total_us:.0%}, "
          f"everything else {1 - matmul_us / total_us:.0%}\n")
    print("| operator | self time share |")
    print("|---|---|")
    for key, value in sorted(self_us.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"| {key} | {value / total_us:.1%} |")


if __name__ == "__main__":
    main()
