"""device: the autocast context and the warning for bf16 on a CPU that would emulate it."""

from __future__ import annotations

import pytest
import torch

from rpr_mt.train import device as device_module
from rpr_mt.train.device import autocast, cpu_bf16_warning


@pytest.fixture
def cpu_probes(monkeypatch):
    """Set what torch reports of the CPU's bfloat16 instructions: (AVX512-BF16, AMX)."""
    def set_probes(avx512_bf16: bool, amx: bool) -> None:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    return set_probes


def test_bf16_on_a_cpu_without_bf16_instructions_is_warned_of(cpu_probes):
    cpu_probes(False, False)
    warning = cpu_bf16_warning(torch.device("cpu"), "bf16")
    assert warning is not None and "no bfloat16 instructions" in warning and "train.precision=fp32" in warning


@pytest.mark.parametrize("instructions", [(True, False), (False, True)])
def test_no_warning_where_the_cpu_has_them(cpu_probes, instructions):
    cpu_probes(*instructions)
    assert cpu_bf16_warning(torch.device("cpu"), "bf16") is None


def test_no_warning_for_fp32_or_off_the_cpu(cpu_probes):
    cpu_probes(False, False)
    assert cpu_bf16_warning(torch.device("cpu"), "fp32") is None
    assert cpu_bf16_warning(torch.device("cuda"), "bf16") is None


def test_a_torch_without_the_probes_is_not_warned_of(monkeypatch):
    for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.delattr(torch.cpu, name, raising=False)
    assert device_module._cpu_has_bf16_instructions()
    assert cpu_bf16_warning(torch.device("cpu"), "bf16") is None


def test_autocast_is_off_for_fp32_and_bf16_otherwise():
    x = torch.randn(2, 3)
    with autocast(torch.device("cpu"), "fp32"):
        assert (x @ x.T).dtype == torch.float32
    with autocast(torch.device("cpu"), "bf16"):
        assert (x @ x.T).dtype == torch.bfloat16
