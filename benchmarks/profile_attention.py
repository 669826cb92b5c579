"""Where the time of one relative-attention forward + backward goes: torch.profiler's self time per op and input
shape, per step, for ``relative_attention`` laid out as the model calls it (q, k, v views of one [B, L, 3, H, d]
projection). The native row kernels are custom ops, so they show up by name beside the GEMMs.

    python3 benchmarks/profile_attention.py --length 128 --batch 32 --clip 16
    python3 benchmarks/profile_attention.py --no-tables            # content only, for comparison
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import profile

from rpr_mt.model.attention import relative_attention

sys.path.insert(0, str(Path(__file__).resolve().parent))  # arguments.py, beside this file
from arguments import ArgumentParser, non_negative_int, positive_int, reports_user_errors  # noqa: E402


@reports_user_errors
def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=positive_int, default=128)
    parser.add_argument("--batch", type=positive_int, default=32)
    parser.add_argument("--heads", type=positive_int, default=8)
    parser.add_argument("--dim", type=positive_int, default=64, help="per-head dimension d")
    parser.add_argument("--clip", type=non_negative_int, default=16)
    parser.add_argument("--impl", default="native")
    parser.add_argument("--no-tables", action="store_true", help="no Shaw tables: content attention only")
    parser.add_argument("--steps", type=positive_int, default=5)
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--rows", type=positive_int, default=16, help="how many ops to print")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    b, h, n, d, k = args.batch, args.heads, args.length, args.dim, args.clip
    qkv = torch.randn(b, n, 3, h, d, requires_grad=True)
    q, key, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    tables = (None, None) if args.no_tables else (
        torch.randn(h, 2 * k + 1, d, requires_grad=True), torch.randn(h, 2 * k + 1, d, requires_grad=True))
    grad_out = torch.randn(b, n, h, d).transpose(1, 2)

    def step() -> None:
        out = relative_attention(q, key, v, *tables, clip=None if args.no_tables else k, impl=args.impl)
        out.backward(grad_out)

    for _ in range(3):
        step()
    with profile(record_shapes=True) as prof:
        for _ in range(args.steps):
            step()
    events = [e for e in prof.key_averages(group_by_input_shape=True) if e.key.startswith(("aten::", "rpr_mt::"))]
    events.sort(key=lambda e: -e.self_cpu_time_total)
    print(f"# B={b} H={h} L={n} d={d} k={k} tables={'none' if args.no_tables else 'K+V per head'} impl={args.impl} "
          f"threads={args.threads}; self CPU time per step (ms), calls per step, input shapes")
    print("# (the aten::fill_/add_ on [B, L, 3, H, d] are this script's gradient of the q/k/v views, not attention)")
    for e in events[: args.rows]:
        print(f"{e.key:32s} {e.count // args.steps:3d}x {e.self_cpu_time_total / args.steps / 1000:8.2f}  "
              f"{str(e.input_shapes)[:100]}")


if __name__ == "__main__":
    main()
