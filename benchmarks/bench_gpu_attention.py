"""Relation-aware attention on a GPU: the fused Triton kernel against the torch path and SDPA's FlashAttention.

For each length L (self-attention, Lq = Lk = L, B = --tokens // L sentences so that every row does the same work)
it times forward + backward (CUDA events, median of --repeats after --warmup) and measures the peak memory of:

    SDPA flash        content attention, no position terms: scaled_dot_product_attention restricted to the
                      FlashAttention backend (the floor relative attention is measured against; with
                      --mask padding the memory-efficient backend, as FlashAttention takes no mask tensor)
    K+V triton        relative_attention(impl="triton"): the fused kernels, both tables (the best of --blocks)
    K only / V only   the same with one table
    K+V torch         relative_attention(impl="fused"): the chunked torch path (the CUDA default where the Triton
                      kernels are not: float32/float16, GPUs before sm_80, no Triton)

Inputs are laid out as MultiHeadAttention produces them ([B, H, L, d] views of one [B, L, 3, H, d] projection), in
--dtype (bf16 by default, as training under autocast), tables per head unless --shared. --mask adds a padding
mask (the last 10% of keys of every other sentence) or a causal one.

    python3 benchmarks/bench_gpu_attention.py                                   # L = 64 ... 1024, bf16, k = 16
    python3 benchmarks/bench_gpu_attention.py --lengths 128 256 512 --mask causal --json out.json
    python3 benchmarks/bench_gpu_attention.py --dry-run                         # the table's form, no GPU needed
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))  # arguments.py, beside this file
from arguments import ArgumentParser, non_negative_int, positive_int, reports_user_errors  # noqa: E402

COLUMNS = ["L", "B", "SDPA flash (ms)", "K+V triton (ms)", "/ SDPA", "K only triton", "V only triton",
           "K+V torch (ms)", "/ SDPA", "peak MiB SDPA / triton / torch", "triton tiles"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=positive_int, nargs="+", default=[64, 128, 256, 512, 1024])
    parser.add_argument("--tokens", type=positive_int, default=16384, help="tokens per batch: B = tokens // L")
    parser.add_argument("--heads", type=positive_int, default=8)
    parser.add_argument("--dim", type=positive_int, default=64, help="per-head dimension d")
    parser.add_argument("--clip", type=non_negative_int, default=16, help="maximum relative distance k")
    parser.add_argument("--shared", action="store_true", help="tables shared across heads (default: per head)")
    parser.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    parser.add_argument("--mask", choices=["none", "padding", "causal"], default="none")
    parser.add_argument("--repeats", type=positive_int, default=20)
    parser.add_argument("--warmup", type=non_negative_int, default=3)
    parser.add_argument("--blocks", nargs="+", default=["64,64,4,2", "128,64,8,2", "64,32,4,3"],
                        help="Triton tile configurations BM,BN,warps,stages to try for K+V (the fastest is used)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: a smoke test of this script in Triton's interpreter (TRITON_INTERPRET=1), no timing "
                             "worth reading")
    parser.add_argument("--json", default=None, help="also write the rows as JSON to this file")
    parser.add_argument("--dry-run", action="store_true", help="print the table's form without measuring")
    return parser.parse_args(argv)


def format_row(values: list[object]) -> str:
    return "| " + " | ".join(str(v) for v in values) + " |"


def header() -> str:
    return format_row(COLUMNS) + "\n" + format_row(["---:"] * 2 + ["---:"] * (len(COLUMNS) - 3) + [":---"])


def table_row(row: dict) -> str:
    def ms(key: str) -> str:
        value = row.get(key)
        return "-" if value is None else f"{value:.2f}"

    def ratio(key: str) -> str:
        value, floor = row.get(key), row.get("sdpa_ms")
        return "-" if value is None or not floor else f"{value / floor:.2f}x"

    mem = " / ".join("-" if row.get(k) is None else f"{row[k]:.0f}" for k in ("sdpa_mib", "kv_triton_mib",
                                                                              "kv_torch_mib"))
    return format_row([row["L"], row["B"], ms("sdpa_ms"), ms("kv_triton_ms"), ratio("kv_triton_ms"),
                       ms("k_triton_ms"), ms("v_triton_ms"), ms("kv_torch_ms"), ratio("kv_torch_ms"), mem,
                       row.get("blocks", "-")])


def timed(fn: Callable[[], torch.Tensor], grad_out: torch.Tensor, repeats: int, warmup: int) -> float:
    """Median milliseconds of forward + backward."""
    for _ in range(warmup):
        fn().backward(grad_out)
    times = []
    for _ in range(repeats):
        if grad_out.device.type != "cuda":
            start = time.perf_counter()
            fn().backward(grad_out)
            times.append((time.perf_counter() - start) * 1e3)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn().backward(grad_out)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def peak_mib(fn: Callable[[], torch.Tensor], grad_out: torch.Tensor) -> float | None:
    if grad_out.device.type != "cuda":
        fn().backward(grad_out)
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn().backward(grad_out)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def make_mask(kind: str, B: int, L: int, device: str) -> torch.Tensor | None:
    """None, a padding mask [B, 1, 1, L] (the last 10% of keys of every other sentence) or a causal one [L, L]."""
    if kind == "padding":
        mask = torch.ones(B, 1, 1, L, dtype=torch.bool, device=device)
        mask[::2, ..., L - max(1, L // 10):] = False
        return mask
    if kind == "causal":
        from rpr_mt.model.masks import causal_mask

        return causal_mask(L, L, device=device)
    return None


def sdpa_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kind: str = "none") -> Callable[[], torch.Tensor]:
    """SDPA's FlashAttention on a GPU (causal: is_causal; padding: the memory-efficient kernel, as flash takes no
    mask tensor)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    mask = make_mask(kind, q.shape[0], q.shape[2], q.device.type) if kind == "padding" else None
    backend = SDPBackend.EFFICIENT_ATTENTION if mask is not None else SDPBackend.FLASH_ATTENTION

    def call() -> torch.Tensor:
        with sdpa_kernel(backend) if q.device.type == "cuda" else contextlib.nullcontext():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=kind == "causal")

    return call


def measure(args: argparse.Namespace) -> list[dict]:
    from rpr_mt.model.kernels import relative_attention
    from rpr_mt.model.kernels.triton_shaw import Blocks

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    device = args.device
    H, d, c = args.heads, args.dim, args.clip
    gen = torch.Generator().manual_seed(0)
    shape = (2 * c + 1, d) if args.shared else (H, 2 * c + 1, d)
    rel_k = (torch.randn(shape, generator=gen) * d**-0.5).to(device, dtype).requires_grad_()
    rel_v = (torch.randn(shape, generator=gen) * d**-0.5).to(device, dtype).requires_grad_()
    candidates = [Blocks(*map(int, spec.split(","))) for spec in args.blocks]
    rows = []
    for L in args.lengths:
        B = max(1, args.tokens // L)
        qkv = torch.randn(B, L, 3, H, d, generator=gen).to(device, dtype).requires_grad_()
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        grad_out = torch.randn(B, L, H, d, generator=gen).to(device, dtype).permute(0, 2, 1, 3)
        mask = make_mask(args.mask, B, L, device)

        def shaw(key, value, impl, blocks=None):
            if impl == "triton" and blocks is not None:
                from rpr_mt.model.kernels.triton_shaw import triton_relative_attention
                from rpr_mt.model.masks import as_4d, revive_dead_rows

                full, dead = (None, None) if mask is None else revive_dead_rows(as_4d(mask))
                return lambda: triton_relative_attention(q, k, v, key, value, None, full, dead, c, 0, 0.0,
                                                         blocks=blocks)
            return lambda: relative_attention(q, k, v, key, value, clip=c, attn_mask=mask, impl=impl)

        sdpa = sdpa_call(q, k, v, args.mask)

        row: dict = {"L": L, "B": B}
        row["sdpa_ms"] = timed(sdpa, grad_out, args.repeats, args.warmup)
        row["sdpa_mib"] = peak_mib(sdpa, grad_out)
        best = None
        for blocks in candidates:
            try:
                ms = timed(shaw(rel_k, rel_v, "triton", blocks), grad_out, args.repeats, args.warmup)
            except Exception as error:  # a configuration that does not fit this GPU (shared memory, registers)
                print(f"# L={L}: tiles {tuple(blocks)} failed: {type(error).__name__}: {error}", file=sys.stderr)
                continue
            if best is None or ms < best[0]:
                best = (ms, blocks)
        if best is not None:
            row["kv_triton_ms"], blocks = best
            row["blocks"] = f"{blocks.m}x{blocks.n} w{blocks.warps} s{blocks.stages}"
            row["kv_triton_mib"] = peak_mib(shaw(rel_k, rel_v, "triton", blocks), grad_out)
            row["k_triton_ms"] = timed(shaw(rel_k, None, "triton", blocks), grad_out, args.repeats, args.warmup)
            row["v_triton_ms"] = timed(shaw(None, rel_v, "triton", blocks), grad_out, args.repeats, args.warmup)
        try:
            row["kv_torch_ms"] = timed(shaw(rel_k, rel_v, "fused"), grad_out, args.repeats, args.warmup)
            row["kv_torch_mib"] = peak_mib(shaw(rel_k, rel_v, "fused"), grad_out)
        except torch.OutOfMemoryError:
            print(f"# L={L}: the torch path ran out of memory", file=sys.stderr)
        rows.append(row)
        print(table_row(row), flush=True)
        del qkv, q, k, v, grad_out
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def describe(args: argparse.Namespace) -> str:
    return (f"# relative attention on {torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}: "
            f"{args.dtype}, H={args.heads} d={args.dim} k={args.clip} "
            f"{'shared' if args.shared else 'per-head'} tables, mask {args.mask}, B = {args.tokens} // L; "
            f"forward+backward, median of {args.repeats}")


@reports_user_errors
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(describe(args))
    print(header())
    if args.dry_run:
        rows = [{"L": L, "B": max(1, args.tokens // L)} for L in args.lengths]
        for row in rows:
            print(table_row(row))
    else:
        if args.device == "cuda" and not torch.cuda.is_available():
            print("no CUDA device: nothing measured (--dry-run prints the table's form)", file=sys.stderr)
            return 2
        rows = measure(args)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"setup": describe(args), "rows": rows}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
