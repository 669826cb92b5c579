"""Where the Triton kernels' time goes on a GPU, and which tiles each kernel should use there.

For each length L (self-attention, B = --tokens // L, Shaw K+V per-head tables, bf16, no mask: the shapes of
``bench_gpu_attention.py``) and each candidate tile configuration BM,BN,warps,stages, it runs forward + backward
under torch.profiler and sums the GPU time of each kernel: the forward, the backward's preprocess, dK/dV and dQ
kernels, and "other" (every other kernel: the zeroing of the table gradients' accumulators, their casts, the
gradient of the q/k/v views). Each kernel's tiles are then chosen separately (the least GPU time summed over the
lengths and masks), and the chosen
``Tiles`` are timed end to end (CUDA events, forward + backward) against ``Tiles()``, the default, and SDPA's
FlashAttention, with the GPU-only time beside it: the difference is host time (Python, launches) that the GPU
waited for; that comparison uses the first of --masks (SDPA's memory-efficient kernel for a padding mask, as flash
takes no mask tensor). A last line measures that host time alone, per call at a tiny shape.

    python3 benchmarks/tune_gpu_attention.py                          # L = 128, 256, 512; prints RPR_MT_TRITON_TILES
    python3 benchmarks/tune_gpu_attention.py --json tune.json --tiles-out tiles.txt
    RPR_MT_TRITON_BACKWARD=serial python3 benchmarks/tune_gpu_attention.py   # the serial backward (as dkdv)
    TRITON_INTERPRET=1 python3 benchmarks/tune_gpu_attention.py --device cpu --lengths 32 --tokens 64 \\
        --candidates 16,16,1,1 --repeats 1    # a smoke test of the script on a CPU (no GPU times)

The printed ``RPR_MT_TRITON_TILES=...`` line makes the chosen tiles the default of every Triton call of a process
(``triton_shaw.parse_tiles``); the measured choice for a GPU belongs in ``triton_shaw.Tiles``' defaults.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # arguments.py, bench_gpu_attention.py, beside this file
from arguments import ArgumentParser, non_negative_int, positive_int, reports_user_errors  # noqa: E402
from bench_gpu_attention import make_mask, sdpa_call  # noqa: E402

# With RPR_MT_TRITON_BACKWARD=serial the backward after the preprocess is one kernel on the dK/dV kernel's tiles: its
# time is counted as dkdv (and dq is 0), so the tiles chosen for dkdv are the serial kernel's.
KERNELS = {"_shaw_fwd": "forward", "_shaw_bwd_pre": "pre", "_shaw_bwd_dkdv": "dkdv", "_shaw_bwd_dq": "dq",
           "_shaw_bwd_serial": "dkdv"}
PARTS = ["forward", "pre", "dkdv", "dq", "other"]
CANDIDATES = ["64,64,4,2", "64,64,4,3", "64,32,4,3", "32,64,4,3", "32,32,2,3", "128,64,8,2", "128,64,8,3",
              "64,128,8,2", "32,128,4,2"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=positive_int, nargs="+", default=[128, 256, 512])
    parser.add_argument("--tokens", type=positive_int, default=16384, help="tokens per batch: B = tokens // L")
    parser.add_argument("--heads", type=positive_int, default=8)
    parser.add_argument("--dim", type=positive_int, default=64)
    parser.add_argument("--clip", type=non_negative_int, default=16)
    parser.add_argument("--candidates", nargs="+", default=CANDIDATES, help="tiles BM,BN,warps,stages to try")
    parser.add_argument("--masks", nargs="+", choices=["none", "padding", "causal"], default=["none"],
                        help="masks to tune for (padding: the last 10%% of keys of every other sentence, as an encoder "
                             "meets it; causal: a decoder's); the tiles are chosen over all of them")
    parser.add_argument("--repeats", type=positive_int, default=10,
                        help="profiled (and timed: 2x) forward+backward calls")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--json", default=None, help="write everything measured to this file")
    parser.add_argument("--tiles-out", default=None, help="write the chosen RPR_MT_TRITON_TILES value to this file")
    return parser.parse_args(argv)


def make_inputs(L: int, args: argparse.Namespace, gen: torch.Generator):
    """q, k, v as MultiHeadAttention makes them ([B, H, L, d] views of one projection), per-head tables, dO."""
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    B, H, d, c = max(1, args.tokens // L), args.heads, args.dim, args.clip
    qkv = torch.randn(B, L, 3, H, d, generator=gen).to(args.device, dtype).requires_grad_()
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    tables = [(torch.randn(H, 2 * c + 1, d, generator=gen) * d**-0.5).to(args.device, dtype).requires_grad_()
              for _ in range(2)]
    grad_out = torch.randn(B, L, H, d, generator=gen).to(args.device, dtype).permute(0, 2, 1, 3)
    return q, k, v, tables, grad_out


def gpu_parts(fn, grad_out: torch.Tensor, repeats: int) -> dict[str, float]:
    """GPU milliseconds per forward+backward call, per kernel group (torch.profiler's kernel records)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):  # compile, allocate
        fn().backward(grad_out)
    if grad_out.device.type != "cuda":
        return {}
    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(repeats):
                fn().backward(grad_out)
            torch.cuda.synchronize()
    except Exception as error:  # no CUPTI: the end-to-end time shared out evenly, so tiles are chosen as one
        print(f"# the profiler failed ({type(error).__name__}: {error}): end-to-end times, split evenly over the "
              "parts, instead", file=sys.stderr)
        return dict.fromkeys(PARTS, timed(fn, grad_out, repeats) / len(PARTS))
    parts = dict.fromkeys(PARTS, 0.0)
    for event in prof.key_averages():
        micros = getattr(event, "device_time_total", None)
        micros = event.cuda_time_total if micros is None else micros
        if micros <= 0:
            continue
        name = next((part for kernel, part in KERNELS.items() if kernel in event.key), "other")
        parts[name] += micros / 1e3 / repeats
    return parts


def timed(fn, grad_out: torch.Tensor, repeats: int) -> float:
    """Median wall milliseconds of forward + backward (CUDA events on a GPU)."""
    from bench_gpu_attention import timed as bench_timed

    return bench_timed(fn, grad_out, repeats, 2)


def host_micros(fn, grad_out: torch.Tensor, calls: int = 50) -> float:
    """Microseconds of host time per forward+backward call at a shape whose GPU work is negligible."""
    for _ in range(3):
        fn().backward(grad_out)
    if grad_out.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn().backward(grad_out)
    if grad_out.device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def choose(sweep: list[dict]):
    """The Tiles with each kernel's least GPU time summed over the lengths and masks (dQ and its preprocess, which
    share their tiles, together; "other" does not depend on the tiles), among the candidates that ran in every case;
    ``Tiles()`` when none did."""
    from rpr_mt.model.kernels.triton_shaw import Blocks, Tiles

    cases = len({(r["L"], r.get("mask", "none")) for r in sweep})

    def total(candidate: str, parts: list[str]) -> float:
        return sum(r["parts"][p] for r in sweep if r["blocks"] == candidate for p in parts)

    candidates = sorted(c for c in {r["blocks"] for r in sweep} if sum(r["blocks"] == c for r in sweep) == cases)
    if not candidates:
        print("# no candidate ran in every case: the default tiles", file=sys.stderr)
        return Tiles()
    forward = min(candidates, key=lambda c: total(c, ["forward"]))
    dkdv = min(candidates, key=lambda c: total(c, ["dkdv"]))
    dq = min(candidates, key=lambda c: total(c, ["pre", "dq"]))

    def blocks(spec: str) -> Blocks:
        return Blocks(*map(int, spec.split(",")))

    return Tiles(blocks(forward), blocks(dkdv), blocks(dq))


@reports_user_errors
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing measured", file=sys.stderr)
        return 2
    from rpr_mt.model.kernels.triton_shaw import Blocks, Tiles, format_tiles, parse_tiles, triton_relative_attention
    from rpr_mt.model.masks import as_4d

    for candidate in args.candidates:
        try:
            parse_tiles(f"fwd={candidate}")
        except ValueError as error:
            print(f"--candidates: {error}", file=sys.stderr)
            return 2

    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu (Triton interpreter)"
    print(f"# Triton tiles on {name}, torch {torch.__version__}: H={args.heads} d={args.dim} k={args.clip} per-head "
          f"K+V, B = {args.tokens} // L, GPU ms per forward+backward (profiler, mean of {args.repeats})")
    gen = torch.Generator().manual_seed(0)
    inputs = {L: make_inputs(L, args, gen) for L in args.lengths}
    result: dict = {"device": name, "torch": torch.__version__, "lengths": args.lengths, "sweep": []}

    def shaw(L: int, tiles, mask_kind: str = "none"):
        q, k, v, (rel_k, rel_v), _ = inputs[L]
        mask = make_mask(mask_kind, q.shape[0], L, args.device)
        mask = None if mask is None else as_4d(mask)
        return lambda: triton_relative_attention(q, k, v, rel_k, rel_v, None, mask, None, args.clip, 0, 0.0,
                                                 blocks=tiles)

    def save() -> None:
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")

    print("| mask | L | tiles | " + " | ".join(PARTS) + " | total |")
    print("| :--- | ---: | :--- |" + " ---: |" * (len(PARTS) + 1))
    for candidate in args.candidates:
        blocks = Blocks(*map(int, candidate.split(",")))
        for mask_kind in args.masks:
            for L in args.lengths:
                try:
                    parts = gpu_parts(shaw(L, Tiles(blocks, blocks, blocks), mask_kind), inputs[L][4], args.repeats)
                except Exception as error:  # a configuration this GPU cannot run (shared memory, registers)
                    print(f"# {candidate} {mask_kind} L={L} failed: {type(error).__name__}: {str(error)[:200]}",
                          file=sys.stderr)
                    continue
                result["sweep"].append({"L": L, "mask": mask_kind, "blocks": candidate, "parts": parts})
                print(f"| {mask_kind} | {L} | {candidate} | " + " | ".join(f"{parts.get(p, 0):.3f}" for p in PARTS)
                      + f" | {sum(parts.values()):.3f} |", flush=True)
        save()

    chosen = choose(result["sweep"]) if args.device == "cuda" else Tiles()
    result["chosen"] = format_tiles(chosen)
    print(f"\nRPR_MT_TRITON_TILES={format_tiles(chosen)}")
    if args.tiles_out:
        Path(args.tiles_out).write_text(format_tiles(chosen) + "\n", encoding="utf-8")

    print("\n| L | B | SDPA flash ms (GPU) | Tiles() ms (GPU) | / SDPA | chosen ms (GPU) | / SDPA |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    result["end_to_end"] = []
    for L in args.lengths:
        q, k, v, _, grad_out = inputs[L]
        row = {"L": L, "B": q.shape[0]}
        mask_kind = args.masks[0]
        row["mask"] = mask_kind
        for key, fn in (("sdpa", sdpa_call(q, k, v, mask_kind)), ("default", shaw(L, Tiles(), mask_kind)),
                        ("chosen", shaw(L, chosen, mask_kind))):
            row[key + "_ms"] = timed(fn, grad_out, 2 * args.repeats)
            row[key + "_gpu_ms"] = sum(gpu_parts(fn, grad_out, args.repeats).values())
        result["end_to_end"].append(row)
        print(f"| {L} | {row['B']} | {row['sdpa_ms']:.3f} ({row['sdpa_gpu_ms']:.3f}) | {row['default_ms']:.3f} "
              f"({row['default_gpu_ms']:.3f}) | {row['default_ms'] / row['sdpa_ms']:.2f}x | {row['chosen_ms']:.3f} "
              f"({row['chosen_gpu_ms']:.3f}) | {row['chosen_ms'] / row['sdpa_ms']:.2f}x |", flush=True)
        save()

    small = {"tokens": 16, "device": args.device, "heads": args.heads, "dim": args.dim, "clip": args.clip}
    q, k, v, (rel_k, rel_v), grad_out = make_inputs(16, argparse.Namespace(**small), gen)
    from rpr_mt.model.kernels import relative_attention

    host = {"sdpa": host_micros(sdpa_call(q, k, v), grad_out),
            "triton kernels": host_micros(lambda: triton_relative_attention(q, k, v, rel_k, rel_v, None, None, None,
                                                                            args.clip, 0, 0.0, blocks=chosen),
                                          grad_out),
            "relative_attention(impl=triton)": host_micros(lambda: relative_attention(q, k, v, rel_k, rel_v,
                                                                                      clip=args.clip, impl="triton"),
                                                           grad_out)}
    result["host_us_per_call"] = host
    print("\nhost time per forward+backward call (B=1, L=16): " + ", ".join(f"{k} {v:.0f} us" for k, v in host.items()))
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
