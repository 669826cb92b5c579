"""benchmarks/bench_ctranslate2.py --quick: the four rows, the two goal lines (a smoke test; numbers mean nothing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_run_prints_every_system_and_the_goals(multi30k_dir):
    done = subprocess.run([sys.executable, "benchmarks/bench_ctranslate2.py", "--quick", "--threads", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split(" | ") for line in done.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert [row[0].lstrip("| ") for row in rows[1:]] == [
        "rpr-mt (cached beam search)", "CTranslate2 float32", "CTranslate2 int8", "CTranslate2 float32, one call"]
    assert rows[2][3] == "1.00"  # the reference row
    assert rows[1][5].strip(" |") == "20/20"  # rpr-mt against itself
    assert "goal: int8 within 0.5 BLEU of float32" in done.stdout
    assert "goal: rpr-mt >= 0.75x CTranslate2 float32 tokens/s" in done.stdout
