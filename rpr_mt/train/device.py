"""The device a rank trains on, its autocast context and its peak memory."""

from __future__ import annotations

import contextlib
import resource

import torch

from rpr_mt.config import Config
from rpr_mt.errors import UserError
from rpr_mt.train.distributed import Distributed


def pick_device(cfg: Config, dd: Distributed) -> torch.device:
    """train.device for this rank: under torchrun each rank takes the GPU of its LOCAL_RANK."""
    kind = cfg.train.device
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise UserError("train.device is 'cuda' but no CUDA device is available")
        torch.cuda.set_device(dd.local_rank)
        return torch.device("cuda", dd.local_rank)
    return torch.device("cpu")


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Mixed precision for train.precision bf16 / fp16; nothing for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory so far: allocated GPU memory on CUDA, the process's maximum resident set on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
