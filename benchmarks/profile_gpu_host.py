"""Where the host (CPU) time of one relative-attention forward+backward on the Triton kernels goes: cProfile of
--calls calls at a shape with no GPU work to speak of (B = 1, L = 16, H = 8, d = 64, k = 16, a padding mask, attention
dropout 0.1), through ``relative_attention(impl="triton")`` as the model calls it. With small batches a GPU waits for
this time (docs/benchmarks.md, "The second GPU session").

    python3 benchmarks/profile_gpu_host.py             # the 35 most expensive functions, by own time and cumulative

Its last line is the host time per call measured without the profiler (``tune_gpu_attention.host_micros``).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from pathlib import Path

import torch

# arguments.py, tune_gpu_attention.py, bench_triton_launch.py, beside this file
sys.path.insert(0, str(Path(__file__).resolve().parent))
from arguments import ArgumentParser, positive_int, reports_user_errors  # noqa: E402


@reports_user_errors
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=positive_int, default=50)
    parser.add_argument("--top", type=positive_int, default=35)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing measured", file=sys.stderr)
        return 2
    from rpr_mt.model.kernels import relative_attention

    from bench_triton_launch import SHAPE, tiny_call

    q, k, v, rel_k, rel_v, grad_out, mask = tiny_call()
    c = SHAPE[3]
    from rpr_mt.model.kernels.triton_shaw import unavailable_reason

    if unavailable_reason(q) is not None:
        print(unavailable_reason(q), file=sys.stderr)
        return 2

    def forward() -> torch.Tensor:
        return relative_attention(q, k, v, rel_k, rel_v, clip=c, attn_mask=mask, impl="triton", dropout_p=0.1)

    def call() -> None:
        forward().backward(grad_out)

    for _ in range(5):  # compile
        call()
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.calls):
        call()
    torch.cuda.synchronize()
    profiler.disable()
    for order in ("tottime", "cumulative"):
        pstats.Stats(profiler).sort_stats(order).print_stats(args.top)
    from tune_gpu_attention import host_micros

    micros = host_micros(forward, grad_out, 4 * args.calls)
    print(f"host time per forward+backward call without the profiler: {micros:.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
