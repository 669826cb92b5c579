import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rpr_mt.host import keep_freed_memory

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt is Linux-only")
def test_keep_freed_memory_takes_effect_and_is_idempotent():
    assert keep_freed_memory() is True
    assert keep_freed_memory() is True
    # Large tensors still allocate, free and reallocate normally.
    for _ in range(3):
        x = torch.ones(64, 2**20)
        assert x.sum().item() == 64 * 2**20
        del x


def _probe(code: str, env_policy: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env_policy is not None:
        env["OMP_WAIT_POLICY"] = env_policy
    # -W error: a RuntimeWarning (the policy set after torch loaded) fails the probe.
    return subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", code], env=env, cwd=ROOT,
                          capture_output=True, text=True)


@pytest.mark.parametrize("script", ["scripts/sweep.py", "scripts/study_positions.py", "scripts/bench_time_to_bleu.py"])
def test_scripts_that_train_sleep_waiting_openmp_threads_before_torch_loads(script):
    """The scripts train in their own process, not through `rpr-mt`: without PASSIVE set before torch loaded
    libgomp, a sweep fell to 10% of its rate beside one other process (849 against 8,661 target tokens/s)."""
    # The script's module level runs (not main): set before any torch import, or the probe's -W error fails it.
    code = "import os, runpy; runpy.run_path(%r, run_name='probe'); print(os.environ['OMP_WAIT_POLICY'])" % script
    result = _probe(code, None)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["PASSIVE"]
    result = _probe(code, "ACTIVE")
    assert result.returncode == 0 and result.stdout.split() == ["ACTIVE"]  # a user's own value wins


def test_setting_the_wait_policy_after_torch_loaded_warns():
    code = "import torch; from rpr_mt.host import sleep_waiting_openmp_threads; sleep_waiting_openmp_threads()"
    result = _probe(code, None)
    assert result.returncode != 0 and "no effect" in result.stderr
    assert _probe(code, "PASSIVE").returncode == 0  # already chosen by the environment: nothing to say
