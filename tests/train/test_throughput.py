"""The one-time slowdown warning: rates are faked, so the tests do not depend on this machine's load."""

from __future__ import annotations

import os

import pytest

from rpr_mt.train.throughput import ThroughputMonitor, slowdown_warning


def feed(monitor: ThroughputMonitor, rates: list[float]) -> list[int]:
    """Indices of the windows at which the monitor asked for a warning."""
    return [i for i, rate in enumerate(rates) if monitor.observe(rate) is not None]


def test_a_lasting_drop_below_half_the_early_rate_warns_once():
    monitor = ThroughputMonitor(threshold=0.5, early_windows=3, patience=2)
    rates = [9000, 9400, 8800, 9100, 4000, 3000, 2500, 1000, 900]
    assert feed(monitor, rates) == [5]  # the second slow window in a row, and never again
    assert monitor.reference == 9000  # the median of the first three windows


def test_steady_or_mildly_slower_runs_do_not_warn():
    assert feed(ThroughputMonitor(), [9000, 9000, 9000] + [4600] * 50) == []  # 51% of the early rate
    assert feed(ThroughputMonitor(), [9000, 9000, 9000, 9200, 8700, 9900]) == []


def test_a_single_slow_window_is_not_a_slowdown():
    # one slow window at a time (a GC pause, a disk flush) with normal ones between them
    assert feed(ThroughputMonitor(), [9000, 9000, 9000, 2000, 9000, 2000, 9000, 2000]) == []


def test_one_fast_or_slow_early_window_does_not_set_the_reference():
    monitor = ThroughputMonitor()
    feed(monitor, [30000, 9000, 8000])  # an outlier among the early windows
    assert monitor.reference == 9000
    assert feed(monitor, [5000, 5000]) == []  # 55% of the median: no warning, though 17% of the outlier


def test_a_run_slow_from_the_start_is_its_own_reference():
    assert feed(ThroughputMonitor(), [1000, 1100, 900, 1000, 950, 1020]) == []


def test_invalid_settings_are_rejected():
    with pytest.raises(ValueError):
        ThroughputMonitor(threshold=1.5)
    with pytest.raises(ValueError):
        ThroughputMonitor(patience=0)


def test_the_warning_gives_cpu_advice_on_cpu_only(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    cpu = slowdown_warning(1000, 9000, 600, "cpu", threads=2)
    assert cpu.startswith("warning: training slowed to 1,000 target tokens/s at update 600, 11% of this run's early")
    assert "train.num_threads=1" in cpu and "OMP_WAIT_POLICY=PASSIVE" in cpu
    assert "train.num_threads=1" not in slowdown_warning(1000, 9000, 600, "cpu", threads=1)
    assert "OMP_WAIT_POLICY" not in slowdown_warning(1000, 9000, 600, "cuda", threads=2)


def test_the_warning_does_not_advise_the_wait_policy_already_in_effect(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    text = slowdown_warning(1000, 9000, 600, "cpu", threads=2)
    assert "train.num_threads=1" in text and "OMP_WAIT_POLICY" not in text


def test_the_cli_sleeps_waiting_openmp_threads_unless_told_otherwise():
    """`rpr-mt` sets OMP_WAIT_POLICY=PASSIVE before torch (and so libgomp) is loaded; a user's value is kept."""
    import subprocess
    import sys

    probe = "import sys, os, rpr_mt.cli; print(os.environ['OMP_WAIT_POLICY'], 'torch' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["PASSIVE", "False"]
    env["OMP_WAIT_POLICY"] = "ACTIVE"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["ACTIVE", "False"]
