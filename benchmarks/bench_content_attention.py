"""Attention without position terms in CPU training: SDPA vs matmul-softmax-matmul vs rpr_mt's native row kernels.

This is the encoder-decoder attention of every model, and all attention of the absolute and no-position models.
It times forward + backward on batches of about 4,096 tokens (B = 4096 // L sentences of L tokens, the last two keys
of each sentence padded), H heads of d dimensions, with attention dropout p:

    sdpa     torch SDPA with dropout_p (on CPU with dropout it runs an unfused path)
    manual   matmul, masked_fill, softmax, rpr_mt's dropout, matmul
    native   rpr_mt's NativeRelativeAttention without tables: one C pass per row for mask, softmax and dropout

Ratios are taken within each round (methods back to back) and the median over rounds is printed.

    python3 benchmarks/bench_content_attention.py --lengths 16 24 32 48 64 100 128 --dropout 0.1
    python3 benchmarks/bench_content_attention.py --lengths 16 32 64 100 128 --dropout 0
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from rpr_mt.host import keep_freed_memory
from rpr_mt.model.dropout import drop_rate, dropout, keep_mask
from rpr_mt.model.kernels.native import NativeRelativeAttention, available

sys.path.insert(0, str(Path(__file__).resolve().parent))  # arguments.py, beside this file
from arguments import ArgumentParser, positive_int, probability, reports_user_errors  # noqa: E402


@reports_user_errors
def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=positive_int, nargs="+", default=[16, 24, 32, 48, 64, 100, 128])
    parser.add_argument("--tokens", type=positive_int, default=4096)
    parser.add_argument("--heads", type=positive_int, default=4)
    parser.add_argument("--dim", type=positive_int, default=64)
    parser.add_argument("--dropout", type=probability, default=0.1)
    parser.add_argument("--rounds", type=positive_int, default=9)
    parser.add_argument("--threads", type=positive_int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    H, d, p = args.heads, args.dim, args.dropout
    if not available(torch.zeros(1)):
        raise SystemExit("the native kernels are not available here (no C compiler, or RPR_MT_NATIVE=0)")
    print(f"# content attention, forward+backward: ~{args.tokens} tokens a batch, H={H} d={d} dropout={p}, "
          f"{args.threads} threads, median of {args.rounds} rounds\n")
    print("| L | B | sdpa (ms) | manual (ms) | native (ms) | manual / sdpa | native / sdpa | native / manual |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for L in args.lengths:
        B = max(1, args.tokens // L)
        qkv = torch.randn(B, L, 3, H, d, requires_grad=True)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [B, H, L, d] views, as in MultiHeadAttention
        grad_out = torch.randn(B, L, H, d).permute(0, 2, 1, 3)
        mask = torch.ones(B, 1, 1, L, dtype=torch.bool)
        mask[..., -2:] = False

        def sdpa():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)

        def manual():
            scores = ((q * d**-0.5) @ k.transpose(-1, -2)).masked_fill(~mask, torch.finfo(torch.float32).min)
            probs = torch.softmax(scores, -1)
            return (dropout(probs, p, True) if p > 0 else probs) @ v

        def native():
            keep = keep_mask((B, H, L, L), p) if p > 0 else None
            rate = drop_rate(p) if p > 0 else 0.0
            return NativeRelativeAttention.apply(q, k, v, None, None, None, mask, None, keep, 0, 0, rate, 8 << 20, True)

        methods = {"sdpa": sdpa, "manual": manual, "native": native}
        times: dict[str, list[float]] = {name: [] for name in methods}
        for fn in methods.values():  # warm-up
            fn().backward(grad_out)
        for _ in range(args.rounds):
            for name, fn in methods.items():
                start = time.perf_counter()
                fn().backward(grad_out)
                times[name].append(time.perf_counter() - start)

        def ratio(a: str, b: str) -> float:
            return statistics.median(x / y for x, y in zip(times[a], times[b]))

        ms = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
        print(f"| {L} | {B} | {ms['sdpa']:.1f} | {ms['manual']:.1f} | {ms['native']:.1f} | "
              f"{ratio('manual', 'sdpa'):.2f} | {ratio('native', 'sdpa'):.2f} | {ratio('native', 'manual'):.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
