"""Benchmark relation-aware attention (Shaw et al., 2018) against plain attention: forward + backward time and memory.

For each sequence length L (self-attention, Lq = Lk = L) it times forward + backward of:

    floor     attention without position terms: the faster of torch SDPA and plain matmul-softmax-matmul
    K+V (native)    rpr_mt relative_attention(impl="native"): C row kernels, relative terms folded into the
                    content matmuls (CPU float32; skipped where the kernel cannot be built)
    K+V (fused)     impl="fused": the pure-torch chunked Function, probabilities saved for backward
    K only, V only  the same with one term (rel_v or rel_k None)
    K+V recompute   the same with save_probs=False: probabilities recomputed in backward (less memory)
    gather    relative_attention(impl="gather"): plain autograd, torch.gather forward, scatter_add folds
    naive     tensor2tensor / OpenNMT-py style: materialises the [H, L, L, d] tables of relation vectors
              (skipped where its memory estimate exceeds --naive-limit-gb)
    content (rpr-mt)   content_attention as the model runs it (auto: the C row kernels in CPU training)
    scheme: NAME       one self-attention layer's position terms of each scheme (rpr_mt.model.positions), as the
                       model runs them: rotation (rope), the bias it builds every call (t5, alibi), the W_R R
                       table (xl: every distance; "xl clip 16": clipped at --clip), Shaw's tables (relative,
                       K+V and K only)

The floor is the fastest content-only attention: SDPA, matmul-softmax-matmul, or rpr-mt's own content path.
``--methods`` keeps the rows whose name contains one of its words (the floor's candidates always run).

Inputs are laid out as MultiHeadAttention produces them: q, k, v are [B, H, L, d] views of one [B, L, 3, H, d]
projection, and the output gradient is a [B, H, L, d] view of a [B, L, H, d] tensor. Times are medians of
--repeats runs (methods interleaved round-robin, after one warm-up run each).

Memory: on CUDA, the peak of torch.cuda.max_memory_allocated during forward + backward minus the memory allocated
before it. On CPU there is no allocator statistic, so the column is "saved-for-backward bytes": the sizes of the
distinct storages the autograd graph keeps between forward and backward (recorded with
torch.autograd.graph.saved_tensors_hooks), not counting the inputs q, k, v and the tables, plus what the fused
and native paths keep from forward to backward outside the graph: their chunk buffers (a few of at most 8 MiB)
and the native path's head-major copies of q, k, v.

    python3 benchmarks/bench_attention.py --lengths 32 64 128 256 512 --repeats 5 --threads 2
    python3 benchmarks/bench_attention.py --methods scheme --lengths 20 --batch 100      # Multi30k training shapes
    python3 benchmarks/bench_attention.py --methods scheme --lengths 128 256 512 --batch 32
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from rpr_mt.config import config_from_dict
from rpr_mt.host import keep_freed_memory
from rpr_mt.model.kernels import content_attention, native, relative_attention
from rpr_mt.model.kernels.geometry import relative_position_index
from rpr_mt.model.positions.base import AttentionPositions
from rpr_mt.model.positions.build import build_position_scheme

sys.path.insert(0, str(Path(__file__).resolve().parent))  # arguments.py, beside this file
from arguments import ArgumentParser, non_negative_int, positive_int, reports_user_errors  # noqa: E402

FLOOR_CANDIDATES = ("SDPA", "matmul-softmax-matmul", "content (rpr-mt)")


def naive_relative_attention(q, k, v, rel_k, rel_v, clip: int):
    """Materialises a_ij^K, a_ij^V as [H, L, L, d] tensors (per-head tables), as tensor2tensor and OpenNMT-py do."""
    heads, q_len, k_len = q.shape[1], q.shape[2], k.shape[2]
    index = relative_position_index(q_len, k_len, clip, device=q.device)  # [L, L]
    table_k = rel_k[:, index] if rel_k.dim() == 3 else rel_k[index].expand(heads, -1, -1, -1)  # [H, L, L, d]
    table_v = rel_v[:, index] if rel_v.dim() == 3 else rel_v[index].expand(heads, -1, -1, -1)
    scores = q @ k.transpose(-1, -2) + torch.einsum("bhid,hijd->bhij", q, table_k)
    probs = torch.softmax(scores * q.shape[-1] ** -0.5, dim=-1)
    return probs @ v + torch.einsum("bhij,hijd->bhid", probs, table_v)


def scheme_layers(heads: int, dim: int, clip: int, device: str) -> dict[str, AttentionPositions]:
    """The encoder self-attention terms of each scheme with attention terms, as the model builds them."""
    def layer(positions: str, **settings) -> AttentionPositions:
        raw = dict(d_model=heads * dim, n_heads=heads, positions=positions, clip=clip, **settings)
        cfg = config_from_dict({"model": raw}).model
        built = build_position_scheme(cfg).to(device)
        return built.self_attention("encoder", 0).to(device)

    return {"relative K+V": layer("relative"), "relative K only": layer("relative", use_value=False),
            "t5": layer("t5"), "alibi": layer("alibi"), "rope": layer("rope"), "xl": layer("xl"),
            "xl clip 16": layer("xl", xl={"clip": clip})}


def scheme_attention(layer: AttentionPositions, q, k, v):
    return layer.attend(q, k, v, attn_mask=None, offset=0, dropout_p=0.0, rotated=False)  # as in training


def manual_attention(q, k, v):
    return torch.softmax((q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2), dim=-1) @ v


class SavedBytes:
    """Sum of distinct storages saved for backward, excluding the given input tensors."""

    def __init__(self, exclude: list[torch.Tensor]) -> None:
        self.exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self.storages: dict[int, int] = {}

    def pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        if storage.data_ptr() not in self.exclude:
            self.storages[storage.data_ptr()] = storage.nbytes()
        return t

    @property
    def total(self) -> int:
        return sum(self.storages.values())


def measure_memory(fn: Callable[[], torch.Tensor], grad_out: torch.Tensor, exclude, device: str) -> int:
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn().backward(grad_out)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    saved = SavedBytes(exclude)
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
        out = fn()
    total = saved.total
    chunk_buffers = getattr(out.grad_fn, "bufs", None)  # the fused/native chunk buffers, kept for the backward
    if chunk_buffers is not None:
        total += sum(buf.untyped_storage().nbytes() for buf in chunk_buffers.bufs.values())
    for copy in getattr(out.grad_fn, "whole", None) or ():  # the native path's head-major q, k, v copies
        total += copy.untyped_storage().nbytes()
    out.backward(grad_out)
    return total


@reports_user_errors
def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=positive_int, nargs="+", default=[32, 64, 128, 256, 512])
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--batch", type=positive_int, default=32)
    parser.add_argument("--heads", type=positive_int, default=8)
    parser.add_argument("--dim", type=positive_int, default=64, help="per-head dimension d")
    parser.add_argument("--clip", type=non_negative_int, default=16, help="maximum relative distance k")
    parser.add_argument("--shared", action="store_true", help="tables shared across heads (default: per head)")
    parser.add_argument("--naive-limit-gb", type=float, default=4.0)
    parser.add_argument("--no-memory", action="store_true", help="skip the memory measurement")
    parser.add_argument("--methods", nargs="+", default=None, help="only rows whose name contains one of these")
    parser.add_argument("--malloc", choices=["keep", "default"], default="keep",
                        help="keep: as `rpr-mt train` does on CPU (rpr_mt.host.keep_freed_memory); default: glibc's")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    if args.malloc == "keep":
        keep_freed_memory()
    device = args.device
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    B, H, d, c = args.batch, args.heads, args.dim, args.clip
    gen = torch.Generator().manual_seed(0)
    table_shape = (2 * c + 1, d) if args.shared else (H, 2 * c + 1, d)
    rel_k = (torch.randn(table_shape, generator=gen) * d**-0.5).to(device).requires_grad_()
    rel_v = (torch.randn(table_shape, generator=gen) * d**-0.5).to(device).requires_grad_()

    native_available = native.available(rel_k)
    layers = scheme_layers(H, d, c, device)
    scheme_params = [p for layer in layers.values() for p in layer.parameters()]
    print(f"# relative attention benchmark: B={B} H={H} d={d} k={c} tables={'shared' if args.shared else 'per head'}")
    print(
        f"# device={device} threads={torch.get_num_threads()} torch={torch.__version__} "
        f"cpu={platform.processor() or platform.machine()} malloc={args.malloc} loadavg={os.getloadavg()[0]:.2f}"
    )
    print("# time: forward+backward, median of", args.repeats, "rounds; ratio: median over rounds of time / floor time")
    mem_label = "peak MiB" if device == "cuda" else "saved MiB"
    print(f"\n| L | method | time (ms) | ratio | {mem_label} |")
    print("|---:|:---|---:|---:|---:|")

    for L in args.lengths:
        qkv = torch.randn(B, L, 3, H, d, generator=gen).to(device).requires_grad_()
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [B, H, L, d] views, as in MultiHeadAttention
        grad_out = torch.randn(B, L, H, d, generator=gen).to(device).permute(0, 2, 1, 3)
        naive_bytes = 4 * H * L * L * d * 4 + 2 * B * H * L * L * 4  # two tables, their grads, logits/probs
        methods: dict[str, Callable[[], torch.Tensor]] = {
            "SDPA": lambda: F.scaled_dot_product_attention(q, k, v),
            "matmul-softmax-matmul": lambda: manual_attention(q, k, v),
            "K+V (native)": lambda: relative_attention(q, k, v, rel_k, rel_v, clip=c, impl="native"),
            "K only (native)": lambda: relative_attention(q, k, v, rel_k, None, clip=c, impl="native"),
            "V only (native)": lambda: relative_attention(q, k, v, None, rel_v, clip=c, impl="native"),
            "K+V (fused)": lambda: relative_attention(q, k, v, rel_k, rel_v, clip=c, impl="fused"),
            "K only (fused)": lambda: relative_attention(q, k, v, rel_k, None, clip=c, impl="fused"),
            "V only (fused)": lambda: relative_attention(q, k, v, None, rel_v, clip=c, impl="fused"),
            "K+V recompute": lambda: relative_attention(q, k, v, rel_k, rel_v, clip=c, impl="fused", save_probs=False),
            "K+V gather": lambda: relative_attention(q, k, v, rel_k, rel_v, clip=c, impl="gather"),
            "content (rpr-mt)": lambda: content_attention(q, k, v),
            **{f"scheme: {name}": (lambda layer=layer: scheme_attention(layer, q, k, v)) for name, layer in layers.items()},
        }
        if args.methods:
            methods = {n: fn for n, fn in methods.items() if n in FLOOR_CANDIDATES or any(w in n for w in args.methods)}
        if not native_available:
            methods = {name: fn for name, fn in methods.items() if "native" not in name}
        if naive_bytes <= args.naive_limit_gb * 2**30 and (not args.methods or any(w in "naive" for w in args.methods)):
            methods["K+V naive [H,L,L,d]"] = lambda: naive_relative_attention(q, k, v, rel_k, rel_v, c)

        def run(fn: Callable[[], torch.Tensor]) -> float:
            sync()
            start = time.perf_counter()
            fn().backward(grad_out)
            sync()
            return time.perf_counter() - start

        times: dict[str, list[float]] = {name: [] for name in methods}
        for fn in methods.values():  # warm-up
            run(fn)
        for _ in range(args.repeats):
            for name, fn in methods.items():
                times[name].append(run(fn))
        median = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
        memory = {}
        if not args.no_memory:
            exclude = [qkv, rel_k, rel_v, *scheme_params]
            memory = {name: measure_memory(fn, grad_out, exclude, device) / 2**20 for name, fn in methods.items()}

        floor_name = min(FLOOR_CANDIDATES, key=median.get)
        for name in methods:
            label = name
            if name in FLOOR_CANDIDATES:
                label = f"floor: {name}" if name == floor_name else f"({name})"
            mem = f"{memory[name]:.1f}" if memory else "-"
            # the ratio is taken within each round and then the median over rounds: the machine's speed drifts
            # by 10-20% over minutes, and a round's methods run back to back, under the same conditions
            ratio = statistics.median(t / f for t, f in zip(times[name], times[floor_name]))
            print(f"| {L} | {label} | {median[name]:.1f} | {ratio:.2f} | {mem} |", flush=True)
        if "K+V naive [H,L,L,d]" not in methods and (not args.methods or "naive" in args.methods):
            print(f"| {L} | K+V naive [H,L,L,d] | skipped (~{naive_bytes / 2**30:.1f} GiB) | | |", flush=True)
        del qkv, q, k, v, grad_out
    print(f"\n# loadavg at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
