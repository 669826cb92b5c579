"""Fault injection for tests: ``RPR_MT_KILL_AT=NAME:N`` kills this process with SIGKILL the N-th time it reaches the
fault point NAME (``checkpoint_write``: a checkpoint's bytes written, not yet renamed into place; ``config_write``:
config.yaml's temporary written, not yet renamed). Unset, a fault point costs one environment lookup."""

from __future__ import annotations

import os
import signal

_reached: dict[str, int] = {}


def fault_point(name: str) -> None:
    spec = os.environ.get("RPR_MT_KILL_AT")
    if not spec:
        return
    target, _, count = spec.partition(":")
    if target != name:
        return
    _reached[name] = _reached.get(name, 0) + 1
    if _reached[name] == int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)
