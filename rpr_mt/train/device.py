"""The device a rank trains on, its autocast context and its peak memory."""

from __future__ import annotations

import contextlib
import os
import resource

import torch

from rpr_mt.config import Config
from rpr_mt.device import resolve_device
from rpr_mt.host import usable_cores
from rpr_mt.train.distributed import Distributed


def pick_device(cfg: Config, dd: Distributed) -> torch.device:
    """train.device for this rank (``rpr_mt.device.resolve_device``): ``cuda:N`` for one process, and under
    torchrun each rank takes the GPU of its LOCAL_RANK; that GPU becomes the current one."""
    device = resolve_device(cfg.train.device, "train.device", local_rank=dd.local_rank, world=dd.world)
    if device.type == "cuda":
        torch.cuda.set_device(device.index)
    return device


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Mixed precision for train.precision bf16 / fp16; nothing for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def cpu_bf16_warning(device: torch.device, precision: str) -> str | None:
    """A warning when bf16 autocast is asked of a CPU without bfloat16 instructions (AVX512-BF16 or AMX): oneDNN
    then emulates the bf16 matrix products, and an update takes several times as long as in fp32 (on an AVX2-only
    machine here the recipe model did not finish 4 updates in 300 s). Where the instructions exist, bf16 is the
    faster choice (docs/benchmarks.md, "bf16 on the CPU")."""
    if device.type != "cpu" or precision != "bf16" or _cpu_has_bf16_instructions():
        return None
    return ("train.precision is bf16 but this CPU has no bfloat16 instructions (AVX512-BF16 or AMX): its matrix "
            "products are emulated, several times slower than fp32; use --set train.precision=fp32 here")


def _cpu_has_bf16_instructions() -> bool:
    """What torch reports of this CPU (private functions of torch.cpu: unknown counts as yes, so no false alarm)."""
    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    if not any(callable(probe) for probe in probes):
        return True
    return any(callable(probe) and probe() for probe in probes)


def oversubscribed_threads_warning(device: torch.device, num_threads: int | None, world: int) -> str | None:
    """A warning when train.num_threads, times the processes torchrun started on this machine, exceeds the cores
    this process may use: OpenMP threads beyond the cores wait on a descheduled sibling."""
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if world > 1 else 1  # torchrun sets it
    if device.type != "cpu" or num_threads is None or num_threads * local_processes <= (cores := usable_cores()):
        return None
    per_process = f" in each of {local_processes} processes" if local_processes > 1 else ""
    return (f"train.num_threads is {num_threads}{per_process} but this machine lets the run use {cores} CPU core(s): "
            "threads beyond the cores wait on each other, which makes an update slower, not faster")


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory so far: allocated GPU memory on CUDA, the process's maximum resident set on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
