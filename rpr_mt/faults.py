"""Fault injection for tests, by environment variable, at named fault points (``checkpoint_write``: a checkpoint's
bytes written, not yet renamed into place; ``config_write``: config.yaml's temporary written, not yet renamed; ``metrics_write``: a line of metrics.jsonl
about to be appended):

- ``RPR_MT_KILL_AT=NAME:N`` kills this process with SIGKILL the N-th time it reaches NAME (a crash mid-write);
- ``RPR_MT_FULL_DISK_AT=NAME:N`` raises ENOSPC there the N-th time (a full disk, in a subprocess a test cannot
  monkeypatch: one rank of a torchrun job).

Unset, a fault point costs two environment lookups."""

from __future__ import annotations

import errno
import os
import signal

_reached: dict[tuple[str, str], int] = {}


def _due(variable: str, name: str) -> bool:
    """Whether the fault that ``variable`` names is at ``name`` and this is its N-th reach."""
    spec = os.environ.get(variable)
    if not spec:
        return False
    target, _, count = spec.partition(":")
    if target != name:
        return False
    _reached[variable, name] = _reached.get((variable, name), 0) + 1
    return _reached[variable, name] == int(count or 1)


def fault_point(name: str) -> None:
    if _due("RPR_MT_KILL_AT", name):
        os.kill(os.getpid(), signal.SIGKILL)
    if _due("RPR_MT_FULL_DISK_AT", name):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
