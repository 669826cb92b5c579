"""Process-level settings for fast CPU work (no model code here; nothing here imports torch).

OpenMP threads that wait for a sibling spin by default; when another process holds a core, the spinning thread burns
the core its sibling needs. Sleeping at once (``OMP_WAIT_POLICY=PASSIVE``) makes training several times faster beside
another busy process and costs little on a quiet machine, so it is the default and a user's own value wins (figures:
docs/benchmarks.md, "CPU threads on a shared machine"). libgomp reads the variable once, when torch loads it, so
``sleep_waiting_openmp_threads`` must run before the first ``import torch``: the ``rpr-mt`` command and the scripts
that train call it first.

glibc's malloc serves every block above 32 MiB (and, by its default heuristics, many smaller ones) with a fresh
``mmap`` and returns it to the kernel on ``free``. A training step allocates and frees the same large tensors every
time (the [tokens, vocabulary] logits and their gradient, activations, dropout masks), so each step pays a page fault
per 4 KiB page of them, plus the kernel zeroing the page: measured here, that is about 12% of a training step of the
d_model 256 Multi30k model and 70% of its loss (`benchmarks/bench_train.py` with and without `--malloc default`). PyTorch's CPU
performance guide recommends swapping in jemalloc or tcmalloc for this reason; `keep_freed_memory` gets the same
effect from glibc itself, with no extra dependency: no mmap'ed blocks and no trimming, so freed memory stays in the
heap and is reused. The price is that the process keeps its peak heap size until it exits, which a training or
decoding process would reach again on its next step anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import warnings

# mallopt(3) parameter numbers from glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4

_done = False


def keep_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse instead of unmapping it; True if the setting took effect.

    Idempotent; a no-op (False) off Linux or with another C library. Only host memory is affected, never CUDA's.
    """
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success. Trim threshold: the largest int, i.e. never give the heap top back.
    _done = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
    return _done


def sleep_waiting_openmp_threads() -> None:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless the environment already chooses a policy (see the module docstring).

    Warns if torch is already loaded and the variable was not set before it: the setting would then have no effect.
    """
    if "OMP_WAIT_POLICY" in os.environ:
        return
    if "torch" in sys.modules:
        warnings.warn("OMP_WAIT_POLICY set after torch was imported: libgomp has already read it, so it has no effect",
                      RuntimeWarning, stacklevel=2)
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"


def give_new_file_mode(fd: int) -> None:
    """Give the file open as ``fd`` (an atomic write's mkstemp temporary) ``new_file_mode``: where there is no fchmod
    (Windows before Python 3.13) or the file system refuses it (some network mounts), the file keeps its mode
    rather than the write failing."""
    if hasattr(os, "fchmod"):
        try:
            os.fchmod(fd, new_file_mode())
        except OSError:
            pass


def new_file_mode() -> int:
    """The mode ``open`` gives a new file under this process's umask (0o644 under 0o022). ``tempfile.mkstemp``, which
    the atomic writes use, makes 0o600 whatever the umask: a checkpoint that others on a shared machine could not
    read, beside a config.yaml they could."""
    umask = os.umask(0)  # read it the only way there is: set it, and put it back at once
    os.umask(umask)
    return 0o666 & ~umask


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity, as taskset or a container's cpuset narrows it), else
    the machine's logical CPUs."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        return os.cpu_count() or 1
