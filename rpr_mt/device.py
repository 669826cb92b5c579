"""Which torch device a device name means: the one resolver behind ``train.device`` and every ``--device``.

Names are ``auto`` (CUDA when available, else the CPU), ``cpu``, ``cuda`` or ``cuda:N`` (``config.DEVICE_NAME``).
A name that cannot be used here (no CUDA, no such GPU) is a ``UserError`` in the words of the setting that gave it:
an option reads ``--device cuda:1: ...``, a config key ``train.device is 'cuda:1' but ...``.
"""

from __future__ import annotations

from typing import Optional

import torch

from rpr_mt.config import DEVICE_NAME
from rpr_mt.errors import UserError

__all__ = ["device_type", "resolve_device"]


def device_type(name: str) -> str:
    """``cuda`` or ``cpu``: the kind of device ``name`` means here (what a process group's backend depends on)."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name.partition(":")[0]


def _refusal(setting: str, name: str, reason: str) -> UserError:
    if setting.startswith("--"):
        return UserError(f"{setting} {name}: {reason}")
    return UserError(f"{setting} is '{name}' but {reason}")


def resolve_device(
    name: str, setting: str = "--device", *, local_rank: Optional[int] = None, world: int = 1
) -> torch.device:
    """The device ``name`` means on this machine, checked; ``setting`` names where it was given, for the errors.

    A single process (``local_rank`` None) gets ``torch.device(name)``, ``cuda`` meaning the current GPU. A rank of a
    torchrun job (``local_rank`` given) gets an indexed device: with ``cuda`` (or ``auto`` on a GPU machine) the GPU
    of its LOCAL_RANK; ``cuda:N``, one GPU, only for a job of one process."""
    if DEVICE_NAME.fullmatch(name) is None:
        raise UserError(f"{setting} must be auto, cpu, cuda or cuda:N (got {name!r})")
    kind = device_type(name)
    if kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise _refusal(setting, name, "no CUDA device is available")
    index = None if name in ("auto", "cuda") else int(name.partition(":")[2])
    if index is not None and world > 1:
        raise UserError(f"{setting} is '{name}', one GPU, but torchrun started {world} processes: each takes the GPU "
                        f"of its LOCAL_RANK with {setting} cuda (choose the GPUs with CUDA_VISIBLE_DEVICES)")
    if index is not None and index >= torch.cuda.device_count():
        raise _refusal(setting, name, f"this machine has {torch.cuda.device_count()} CUDA device(s), numbered from 0")
    if local_rank is None:
        return torch.device("cuda") if index is None else torch.device("cuda", index)
    return torch.device("cuda", local_rank if index is None else index)
