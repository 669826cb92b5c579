"""Data-parallel set-up under ``torchrun``: which rank this process is, and the collective calls the loop needs.

Every rank builds the same global batches and takes its share of each (``batching``), so W processes compute the
same update as one process with the same global batch; rank 0 alone writes checkpoints, metrics and logs.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from rpr_mt.errors import UserError


@dataclass
class Distributed:
    """This process's place among the ranks (one process: rank 0 of 1)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def log(self, text: str) -> None:
        """A line on stderr, from rank 0 only."""
        if self.is_main:
            print(text, file=sys.stderr, flush=True)

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def all_true(self, flag: bool, device: torch.device) -> bool:
        """``flag`` on every rank: decisions that every rank must take together."""
        if self.world == 1:
            return flag
        value = torch.tensor([1.0 if flag else 0.0], device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MIN)
        return bool(value.item() > 0)

    def together(self, work: Callable[[], None], device: torch.device, what: str) -> None:
        """``work`` on every rank, which then wait for each other. A UserError on one (rank 0's full disk: it alone
        writes files) stops every rank with one line: its own, the others' "rank 0 could not WHAT (it says why)".
        Every rank leaves together: a rank that raised alone would leave the others waiting at the next collective
        for it, until torchrun killed them or the broken process group ended them in a traceback."""
        failure: UserError | None = None
        try:
            work()
        except UserError as exc:
            failure = exc
        if not self.all_true(failure is None, device):
            raise failure or UserError(f"rank 0 could not {what} (it says why)")

    def on_main(self, work: Callable[[], None], device: torch.device, what: str) -> None:
        """``together`` for work that rank 0 alone does (the others only wait for it)."""
        self.together(work if self.is_main else lambda: None, device, what)

    def all_sum(self, values: list[float], device: torch.device) -> list[float]:
        """The sums over the ranks of each of ``values`` (in float64), the same on every rank."""
        if self.world == 1:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return [float(v) for v in tensor.tolist()]


def init_distributed(device_kind: str) -> Distributed:
    """Join the process group that torchrun describes in WORLD_SIZE / LOCAL_RANK (NCCL on CUDA, gloo on CPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Distributed()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_kind == "cuda" else "gloo")
    return Distributed(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
