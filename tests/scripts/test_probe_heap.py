"""benchmarks/probe_heap.py: the wrapped rpr-mt command runs as it would alone, with the heap sampled on stderr (a
smoke test; the numbers mean nothing)."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _has_mallinfo2() -> bool:
    try:
        return hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not _has_mallinfo2(),
                                reason="needs glibc >= 2.33 (mallinfo2)")


@pytest.mark.parametrize("options", [[], ["--trim", "--default-malloc", "--every", "0.5"]])
def test_the_command_runs_with_the_heap_sampled(tmp_path, options):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "benchmarks/probe_heap.py", *options, "--", "train", "--config",
                           "configs/demo.yaml", "--set", f"train.run_dir={tmp_path / 'run'}", "--dry-run"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Seq2Seq(" in done.stdout  # the dry run's model
    assert re.search(r"^probe: resident [\d,]+ MiB \| heap [\d,]+ MiB, in use [\d,]+, free [\d,]+ \| mmapped",
                     done.stderr, re.MULTILINE), done.stderr[-2000:]
    assert ("probe: malloc_trim took" in done.stderr) == bool(options)


def test_an_exit_code_of_the_command_is_the_probes():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "benchmarks/probe_heap.py", "--", "train", "--config", "missing.yaml"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 2 and "missing.yaml" in done.stderr, done.stderr[-2000:]
