"""Is a custom C op still worth it? The native row kernels (a torch custom op) against ``torch.compile`` of the
pure-torch paths of Shaw attention, forward + backward, in float32 on the CPU.

Issue #16 asked to keep the C kernels as a registered op, or to replace them if ``torch.compile`` of the pure-torch
path comes within 5% of them. This prints the median time of each and the ratio to the native op, per shape:

    native     relative_attention(impl="native"): the C row kernels (rpr_mt::relative_rows_forward/backward)
    compiled   torch.compile(relative_attention(impl="gather")): Inductor fuses the gather composition
    fused      relative_attention(impl="fused"): the chunked pure-torch Function, uncompiled (for reference)

    python3 benchmarks/bench_compile.py                       # Multi30k training shape and L = 128, 2 threads
    python3 benchmarks/bench_compile.py --shapes 4x2x16 --repeats 1   # a quick correctness run

Compilation happens in the warm-up and is not timed (it is printed). Shapes are static here (dynamic=False), the
best case for the compiler: in training every batch has another length, so a compiled path would also pay for
recompilation or dynamic shapes. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from rpr_mt.host import keep_freed_memory
from rpr_mt.model.kernels import relative_attention

sys.path.insert(0, str(Path(__file__).resolve().parent))  # arguments.py, beside this file
from arguments import ArgumentParser, non_negative_int, positive_int, reports_user_errors  # noqa: E402


def batch_shape(text: str) -> str:
    """An argparse type: BATCHxHEADSxLENGTH, three positive integers (kept as written: it labels the rows)."""
    parts = text.split("x")
    if len(parts) != 3 or not all(part.isdigit() and int(part) > 0 for part in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: expected BATCHxHEADSxLENGTH, three positive integers like 32x8x128")
    return text


@reports_user_errors
def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", type=batch_shape, default=["100x4x20", "32x8x128"],
                        help="BATCHxHEADSxLENGTH")
    parser.add_argument("--dim", type=positive_int, default=64)
    parser.add_argument("--clip", type=non_negative_int, default=16)
    parser.add_argument("--repeats", type=positive_int, default=7)
    parser.add_argument("--threads", type=positive_int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    compiled = torch.compile(lambda *a: relative_attention(*a, clip=args.clip, impl="gather"), dynamic=False)
    print(f"# torch {torch.__version__}, {args.threads} threads, d={args.dim}, k={args.clip}, per-head K+V tables")
    print("| B x H x L | method | ms (fwd+bwd) | / native |")
    print("|---|---|---:|---:|")
    for shape in args.shapes:
        batch, heads, length = map(int, shape.split("x"))
        gen = torch.Generator().manual_seed(0)
        qkv = [torch.randn(batch, heads, length, args.dim, generator=gen).requires_grad_() for _ in range(3)]
        tables = [(torch.randn(heads, 2 * args.clip + 1, args.dim, generator=gen) * args.dim**-0.5).requires_grad_()
                  for _ in range(2)]
        grad = torch.randn(batch, heads, length, args.dim, generator=gen)
        methods = {
            "native": lambda: relative_attention(*qkv, *tables, clip=args.clip, impl="native"),
            "compiled": lambda: compiled(*qkv, *tables),
            "fused": lambda: relative_attention(*qkv, *tables, clip=args.clip, impl="fused"),
        }
        start = time.perf_counter()
        methods["compiled"]().backward(grad)
        print(f"# {shape}: first compiled call (compilation) {time.perf_counter() - start:.1f} s")
        reference = methods["native"]()
        torch.testing.assert_close(methods["compiled"](), reference, atol=1e-4, rtol=1e-4)
        times: dict[str, list[float]] = {name: [] for name in methods}
        for fn in methods.values():
            fn().backward(grad)  # warm-up
        for _ in range(args.repeats):  # round-robin: the machine's drift hits every method alike
            for name, fn in methods.items():
                start = time.perf_counter()
                fn().backward(grad)
                times[name].append(time.perf_counter() - start)
        for name, ts in times.items():
            ratio = statistics.median(t / n for t, n in zip(ts, times["native"]))
            print(f"| {shape} | {name} | {statistics.median(ts) * 1e3:.1f} | {ratio:.2f} |", flush=True)


if __name__ == "__main__":
    main()
