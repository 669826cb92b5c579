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


def _config(device: str):
    from rpr_mt.config import config_from_dict
    return config_from_dict({"data": {"source": "demo"}, "train": {"device": device, "max_steps": 1}})


@pytest.mark.parametrize("name", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_train_device_takes_what_translate_takes(name):
    assert _config(name).train.device == name


@pytest.mark.parametrize("name", ["gpu", "cuda:", "cuda:x", "CPU", "cuda:-1"])
def test_other_devices_are_refused_naming_the_key(name):
    from rpr_mt.errors import UserError
    with pytest.raises(UserError, match=r"train.device must be auto, cpu, cuda or cuda:N \(got "):
        _config(name)


@pytest.fixture
def two_gpus(monkeypatch):
    """A machine with two CUDA devices, as far as pick_device asks (set_device recorded, not called)."""
    chosen: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    return chosen


def test_cuda_n_picks_that_gpu_for_one_process(two_gpus):
    from rpr_mt.train.device import pick_device
    from rpr_mt.train.distributed import Distributed
    assert pick_device(_config("cuda:1"), Distributed()) == torch.device("cuda", 1) and two_gpus == [1]
    assert pick_device(_config("cuda"), Distributed(rank=1, world=2, local_rank=1)) == torch.device("cuda", 1)


def test_cuda_n_beyond_the_machine_or_under_torchrun_is_refused(two_gpus):
    from rpr_mt.errors import UserError
    from rpr_mt.train.device import pick_device
    from rpr_mt.train.distributed import Distributed
    with pytest.raises(UserError, match=r"'cuda:2' but this machine has 2 CUDA device\(s\), numbered from 0"):
        pick_device(_config("cuda:2"), Distributed())
    with pytest.raises(UserError, match=r"'cuda:1', one GPU, but torchrun started 2 processes.*CUDA_VISIBLE_DEVICES"):
        pick_device(_config("cuda:1"), Distributed(rank=0, world=2, local_rank=0))
    assert two_gpus == []


def test_cuda_without_a_gpu_is_refused(monkeypatch):
    from rpr_mt.errors import UserError
    from rpr_mt.train.device import pick_device
    from rpr_mt.train.distributed import Distributed
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match="train.device is 'cuda:0' but no CUDA device is available"):
        pick_device(_config("cuda:0"), Distributed())
