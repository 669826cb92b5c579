"""How much of a Triton relative-attention call's host time is Triton's launcher, and what the direct launches of
``rpr_mt.model.kernels.triton_launch`` take away. Host microseconds per call at a shape with no GPU work to speak of
(B = 1, L = 16, H = 8, d = 64, k = 16, a padding mask, attention dropout 0.1), each the median of --repeats runs of
--calls calls:

    sdpa                  content_attention: the absolute model's self-attention, forward + backward
    dispatch, direct      relative_attention(impl="triton"), forward + backward, as the relative model calls it:
                          each kernel relaunched through its compiled variant (``triton_launch.Launcher``)
    dispatch, jit         the same with every launch through ``JITFunction.run`` (``Launcher.direct`` off), which
                          binds and specializes ~50 arguments and builds a cache key each time
    function, direct/jit  ``TritonShawAttention.apply`` on prepared arguments (no dispatch, no mask preparation)

then, per kernel, one launch through ``JITFunction.run`` against one through the compiled kernel's runner, and the
cost of a ``torch.empty`` and a ``torch.zeros`` on the device. With small batches a GPU waits for this time
(docs/benchmarks.md, "The second GPU session" and "The fifth GPU session").

    python3 benchmarks/bench_triton_launch.py            # on a CUDA GPU with Triton >= 3.3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # arguments.py, beside this file
from arguments import ArgumentParser, positive_int, reports_user_errors  # noqa: E402

KERNELS = ("_shaw_fwd", "_shaw_bwd_pre", "_shaw_bwd_dkdv", "_shaw_bwd_dq")


SHAPE = (8, 16, 64, 16)  # H, L, d, k: one sentence of 16 tokens, the base model's heads


def tiny_call(device: str = "cuda") -> tuple[torch.Tensor, ...]:
    """q, k, v (bf16 views of one projection, as MultiHeadAttention makes them), float32 per-head tables (the
    model's parameters under bf16 autocast), dO and a padding mask, at B = 1 and the lengths of ``SHAPE``: a call
    whose GPU work is negligible, so that its time is the host's."""
    H, L, d, c = SHAPE
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(1, L, 3, H, d, generator=gen).to(device, torch.bfloat16).requires_grad_()
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    rel_k, rel_v = ((torch.randn(H, 2 * c + 1, d, generator=gen) * d**-0.5).to(device).requires_grad_()
                    for _ in range(2))
    grad_out = torch.randn(1, H, L, d, generator=gen).to(device, torch.bfloat16)
    mask = torch.ones(1, 1, 1, L, dtype=torch.bool, device=device)
    return q, k, v, rel_k, rel_v, grad_out, mask


def micros(fn: Callable[[], object], calls: int, repeats: int) -> float:
    """Median over ``repeats`` of the host microseconds per call of ``fn`` (synchronized before and after)."""
    for _ in range(3):
        fn()
    runs = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(runs)


def grid3(grid: tuple) -> tuple:
    """A launch grid as the three dimensions a compiled kernel's runner indexes."""
    return tuple(grid) + (1,) * (3 - len(grid))


class Recorded:
    """A kernel's ``[grid](*args, **kwargs)`` calls, recorded and passed on (to replay the launches one by one)."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.calls: list[tuple] = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append((grid, args, kwargs))
            return self.kernel[grid](*args, **kwargs)

        return launch


@reports_user_errors
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=positive_int, default=100)
    parser.add_argument("--repeats", type=positive_int, default=5)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing measured", file=sys.stderr)
        return 2
    from rpr_mt.model.kernels import content_attention, relative_attention, triton_shaw
    from rpr_mt.model.masks import as_4d, revive_dead_rows

    H, L, d, c = SHAPE
    q, k, v, rel_k, rel_v, grad_out, mask = tiny_call()
    reason = triton_shaw.unavailable_reason(q)
    if reason is not None:
        print(reason, file=sys.stderr)
        return 2
    mask4, dead = revive_dead_rows(as_4d(mask))

    def sdpa() -> None:
        content_attention(q, k, v, attn_mask=mask, dropout_p=0.1).backward(grad_out)

    def dispatch() -> None:
        relative_attention(q, k, v, rel_k, rel_v, clip=c, attn_mask=mask, impl="triton", dropout_p=0.1).backward(
            grad_out)

    def function() -> None:
        triton_shaw.TritonShawAttention.apply(q, k, v, rel_k, rel_v, None, mask4, dead, None, c, 0, 0.1,
                                              triton_shaw.draw_seed(), None).backward(grad_out)

    function()  # the launchers exist from here on

    def direct(flag: bool) -> None:
        for name in KERNELS:
            triton_shaw._LAUNCHERS[id(getattr(triton_shaw, name))].direct = flag

    rows = [("sdpa", micros(sdpa, args.calls, args.repeats))]
    for flag in (True, False):
        direct(flag)
        label = "direct" if flag else "jit"
        rows.append((f"dispatch, {label}", micros(dispatch, args.calls, args.repeats)))
        rows.append((f"function, {label}", micros(function, args.calls, args.repeats)))
    direct(True)
    originals = {name: getattr(triton_shaw, name) for name in KERNELS}
    try:
        for name in KERNELS:
            setattr(triton_shaw, name, Recorded(originals[name]))
        function()
        recorded = {name: getattr(triton_shaw, name).calls[0] for name in KERNELS}
    finally:
        for name, kernel in originals.items():
            setattr(triton_shaw, name, kernel)

    print(f"# host microseconds per call (median of {args.repeats} x {args.calls} calls), B = 1, L = {L}, H = {H}, "
          f"d = {d}, k = {c}, padding mask, dropout 0.1, bf16 (float32 tables), {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}, triton {triton_shaw.triton.__version__}")
    print("| call | host us |\n|:---|---:|")
    for name, value in rows:
        print(f"| {name} | {value:.0f} |")
    print("\n| kernel | JITFunction.run us | compiled kernel us |\n|:---|---:|---:|")
    for name in KERNELS:
        grid, call_args, call_kwargs = recorded[name]
        kernel = originals[name]
        compiled = kernel[grid](*call_args, **call_kwargs)
        positional = list(call_args) + [call_kwargs[p.name] for p in kernel.params[len(call_args):]]
        jit_us = micros(lambda: kernel[grid](*call_args, **call_kwargs), args.calls, args.repeats)
        compiled_us = micros(lambda: compiled[grid3(grid)](*positional), args.calls, args.repeats)
        print(f"| {name} | {jit_us:.1f} | {compiled_us:.1f} |")
    empty_us = micros(lambda: torch.empty(1, H, L, 32, device="cuda"), args.calls, args.repeats)
    zeros_us = micros(lambda: torch.zeros(1, H, L, 32, device="cuda"), args.calls, args.repeats)
    print(f"\ntorch.empty {empty_us:.1f} us, torch.zeros {zeros_us:.1f} us (host, per call)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
