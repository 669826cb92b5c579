"""Advisory locks (``flock``) on run directories: taking one, retried briefly, and asking whether another process
holds one. The trainer locks its run directory's ``.train.lock`` (rpr_mt.train.run_dir.RunDirLock), a sweep job the
run directory itself while it prepares, trains and decodes the run (rpr_mt.experiments.sweep), and ``sweep --list``
asks both. No torch here: ``--list`` imports none. Without fcntl (Windows) nothing is locked."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import IO, Iterator, Union

try:
    import fcntl
except ImportError:  # pragma: no cover (Windows)
    fcntl = None  # type: ignore[assignment]

__all__ = ["fcntl", "held_by_another", "locked_directory", "try_exclusive_lock"]


def try_exclusive_lock(target: Union[int, IO], tries: int = 5, wait_s: float = 0.05) -> bool:
    """``flock(LOCK_EX | LOCK_NB)`` on an open file or descriptor, retried for up to ``tries * wait_s``: False when
    another process holds the lock for longer (a running job), not when ``held_by_another``'s probe holds it for an
    instant. OSError (a file system without locks) goes to the caller."""
    for attempt in range(tries):
        try:
            fcntl.flock(target, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt < tries - 1:
                time.sleep(wait_s)
    return False


def held_by_another(path: Path) -> bool:
    """Whether another process holds an exclusive lock on ``path`` (a file or a directory); False when it does not
    exist, or where nothing can be locked. The probe takes a shared lock for an instant; lockers retry past it."""
    if fcntl is None or not path.exists():
        return False
    try:
        fd = os.open(path, os.O_RDONLY)  # read-only: flock needs no write permission
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # a file system without locks
        return False
    finally:
        os.close(fd)  # drops the probe's lock
    return False


@contextlib.contextmanager
def locked_directory(path: Path, wait: bool) -> Iterator[bool]:
    """An exclusive lock on the directory ``path`` itself (no lock file is left in it) for the block: waited for
    (``wait``), or tried briefly (``try_exclusive_lock``). Yields whether it is held: False only when another process
    holds it; True also where nothing can be locked (no fcntl, a file system without locks), which goes unlocked."""
    if fcntl is None:
        yield True
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            if wait:
                fcntl.flock(fd, fcntl.LOCK_EX)
                held = True
            else:
                held = try_exclusive_lock(fd)
        except OSError:  # ENOLCK: a file system without locks
            held = True
        yield held
    finally:
        os.close(fd)  # drops the lock
