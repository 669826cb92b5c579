"""The label-smoothed loss in CPU training: rpr_mt's closed-form Function against autograd through log_softmax.

Times forward + backward of the loss over N target tokens and a V-piece vocabulary (the rows the trainer passes: no
padding), both methods back to back in each round, and prints the median time of each and the median of the
per-round ratios. ``autograd`` is the textbook computation (log_softmax, gather, mean, autograd's backward), as
rpr_mt computed it before; ``fused`` is ``rpr_mt.train.loss.label_smoothed_nll``.

    python3 benchmarks/bench_loss.py                                  # N = 3,600 (a 4,096-token batch), V = 8,000
    python3 benchmarks/bench_loss.py --tokens 1800 3600 --vocab 8000 32768 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from rpr_mt.host import keep_freed_memory
from rpr_mt.train.loss import label_smoothed_nll

sys.path.insert(0, str(Path(__file__).resolve().parent))  # arguments.py, beside this file
from arguments import ArgumentParser, at_least, positive_int, reports_user_errors  # noqa: E402


def autograd_loss(logits: torch.Tensor, target: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    lprobs = torch.log_softmax(logits, dim=-1)
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return ((1.0 - epsilon) * nll + epsilon * -lprobs.mean(dim=-1)).sum(), nll.sum()


def time_once(loss_fn, logits: torch.Tensor, target: torch.Tensor) -> float:
    x = logits.detach().requires_grad_()
    start = time.perf_counter()
    loss, _ = loss_fn(x, target, 0.1)
    loss.backward()
    return time.perf_counter() - start


@reports_user_errors
def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=positive_int, nargs="+", default=[3600])
    parser.add_argument("--vocab", type=at_least(2), nargs="+", default=[8000])
    parser.add_argument("--rounds", type=positive_int, default=11)
    parser.add_argument("--threads", type=positive_int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as the trainer runs: freed [N, V] buffers are reused, not returned to the OS
    print(f"# label-smoothed loss, forward+backward, {args.threads} threads, median of {args.rounds} rounds\n")
    print("| N | V | autograd (ms) | fused (ms) | fused / autograd |")
    print("|---:|---:|---:|---:|---:|")
    for n in args.tokens:
        for v in args.vocab:
            logits, target = torch.randn(n, v), torch.randint(0, v, (n,))
            for fn in (autograd_loss, label_smoothed_nll):  # warm-up: first-touch page faults
                time_once(fn, logits, target)
            rounds = [(time_once(autograd_loss, logits, target), time_once(label_smoothed_nll, logits, target))
                      for _ in range(args.rounds)]
            slow = statistics.median(a for a, _ in rounds)
            fast = statistics.median(b for _, b in rounds)
            ratio = statistics.median(b / a for a, b in rounds)
            print(f"| {n} | {v} | {slow * 1e3:.1f} | {fast * 1e3:.1f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
