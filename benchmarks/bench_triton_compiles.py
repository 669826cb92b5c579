"""How many variants of the Triton attention kernels a trainer compiles, and what its first calls cost: --calls
forward+backward calls of ``relative_attention(impl="triton")`` in bf16 at the lengths and dropout seeds a base-model
trainer meets (WMT-like lengths 20-100, B = --tokens // L, d = 64, 8 heads, k = 16, attention dropout 0.1 with a
fresh seed each call), alternating an encoder-like call (padding mask) and a decoder-like one (causal and padding).

Triton compiles a kernel once per combination of its constexprs and of the specializations of its integer arguments
(== 1, divisible by 16); arguments that change with every batch or call would each add variants that appear long
into the first epoch. Prints the variants compiled and the seconds spent after each tenth of the calls.

    python3 benchmarks/bench_triton_compiles.py --calls 200 --json compiles.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # arguments.py, beside this file
from arguments import ArgumentParser, positive_int, reports_user_errors  # noqa: E402


@reports_user_errors
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=positive_int, default=200)
    parser.add_argument("--tokens", type=positive_int, default=3125, help="tokens per call: B = tokens // L")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing measured", file=sys.stderr)
        return 2
    from rpr_mt.model.kernels import relative_attention
    from rpr_mt.model.kernels.triton_shaw import compiled_variants, unavailable_reason
    from rpr_mt.model.masks import causal_mask

    heads, dim, clip = 8, 64, 16
    probe = torch.empty(1, device="cuda", dtype=torch.bfloat16)
    if unavailable_reason(probe) is not None:
        print(unavailable_reason(probe), file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    tables = [(torch.randn(heads, 2 * clip + 1, dim, device="cuda") * dim**-0.5).bfloat16().requires_grad_()
              for _ in range(2)]
    rows, start = [], time.perf_counter()
    for call in range(1, args.calls + 1):
        length = int(rng.integers(20, 101))
        batch = max(1, args.tokens // length)
        q, k, v = (torch.randn(batch, heads, length, dim, device="cuda", dtype=torch.bfloat16).requires_grad_()
                   for _ in range(3))
        lengths = torch.from_numpy(rng.integers(length // 2, length + 1, batch)).cuda()
        lengths[0] = length
        mask = (torch.arange(length, device="cuda") < lengths[:, None])[:, None, None, :]  # [B, 1, 1, L]
        if call % 2 == 0:  # decoder self-attention
            mask = mask & causal_mask(length, length, device="cuda")
        out = relative_attention(q, k, v, *tables, clip=clip, attn_mask=mask, impl="triton", dropout_p=0.1)
        out.backward(torch.ones_like(out))
        if call % max(1, args.calls // 10) == 0 or call == args.calls:
            torch.cuda.synchronize()
            row = {"calls": call, "variants": compiled_variants(), "seconds": round(time.perf_counter() - start, 2)}
            rows.append(row)
            print(f"after {call:4d} calls: {row['variants']} kernel variants compiled, {row['seconds']:.1f} s",
                  flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"device": torch.cuda.get_device_name(), "calls": args.calls, "tokens": args.tokens,
                       "rows": rows}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
