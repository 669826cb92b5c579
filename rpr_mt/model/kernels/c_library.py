"""Build and load the project's C kernels (``rpr_mt/model/kernels/csrc``): compiled on first use, cached, loaded with ctypes.

Why not torch.utils.cpp_extension: its headers make one build take ~80 s on a 2-core machine, while these
kernels are plain C over raw pointers (the matrix products stay in torch) and build in about a second. The
library is compiled for the host CPU (-march=native), so the cache key includes the CPU's feature flags as well
as the source and the compiler; a build goes to a temporary file and is renamed into place, so concurrent
processes (DDP ranks, pytest workers) never load a half-written library.

Everything degrades gracefully: without a C compiler, with ``RPR_MT_NATIVE=0``, or if the build fails, the
loader returns None (after one warning naming the reason) and callers use their pure-torch path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent / "csrc"
# -ffast-math for vectorized loops and expf, but -fno-finite-math-only: the kernels must keep the IEEE meaning of
# infinities and NaN (a -inf bias, a NaN logit), which finite-math-only makes undefined.
FLAGS = ["-O3", "-march=native", "-ffast-math", "-fno-finite-math-only", "-fopenmp", "-shared", "-fPIC", "-std=c11"]


def cache_dir() -> Path:
    """$RPR_MT_CACHE_DIR, else $XDG_CACHE_HOME/rpr_mt, else ~/.cache/rpr_mt (``build`` falls back to the temporary
    directory if it cannot write there)."""
    if os.environ.get("RPR_MT_CACHE_DIR"):
        return Path(os.environ["RPR_MT_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rpr_mt"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")


def build(name: str) -> Path:
    """Compile ``csrc/<name>.c`` into the cache (if not there yet) and return the library's path.

    Raises RuntimeError (with the compiler's message) if there is no compiler or the build fails."""
    source = SOURCE_DIR / f"{name}.c"
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C compiler found (set CC)")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256(
        "\0".join([source.read_text(), compiler, version, " ".join(FLAGS), platform.machine(), _cpu_flags()]).encode()
    ).hexdigest()[:16]
    target = cache_dir() / f"{name}-{key}.so"
    if target.exists():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    except OSError:  # an unwritable cache (read-only home): build into the temporary directory instead
        target = Path(tempfile.gettempdir()) / f"rpr_mt-{os.getuid()}" / target.name
        if target.exists():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        result = subprocess.run([compiler, *FLAGS, str(source), "-o", tmp, "-lm"], capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed on {source}: {result.stderr.strip()[-2000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


@functools.lru_cache(maxsize=None)
def load(name: str) -> ctypes.CDLL | None:
    """The compiled ``csrc/<name>.c`` as a ctypes library, or None if native kernels are off or cannot be built.

    ctypes.CDLL releases the GIL during calls; the kernels use OpenMP and share torch's runtime (libgomp is
    already loaded by torch under the same soname), so they follow torch.set_num_threads."""
    if os.environ.get("RPR_MT_NATIVE", "1") == "0":
        return None
    try:
        import torch  # noqa: F401  (load torch's OpenMP runtime first, so that the kernel library shares it)

        return ctypes.CDLL(str(build(name)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        warnings.warn(f"native kernel {name!r} unavailable, using the pure-torch path: {error}", stacklevel=2)
        return None
