"""benchmarks/bench_split.py --quick: both ways timed and their ratio printed (a smoke test; numbers mean nothing)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_quick_run_prints_both_ways_and_the_ratio():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "benchmarks/bench_split.py", "--quick", "--threads", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "4 lines, 6 sentences" in done.stdout  # the splitter's count: 3 + 1 + 0 + 2
    rows = [line.split(" | ") for line in done.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert [row[0].lstrip("| ") for row in rows[1:]] == ["split", "whole"]
    assert re.search(r"^split / whole throughput: \d+\.\d\dx$", done.stdout, re.MULTILINE)
