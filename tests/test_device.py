"""rpr_mt/device.py: what each device name means here and how a name that cannot run is said, in the words of the
setting that gave it (the GPU cases on a machine with two GPUs as far as torch is asked: tests/train/test_device.py)."""

from __future__ import annotations

import pytest
import torch

from rpr_mt.device import device_type, resolve_device
from rpr_mt.errors import UserError


def test_cpu_and_auto_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("cpu") == torch.device("cpu") == resolve_device("auto", "train.device", local_rank=0)
    assert device_type("auto") == "cpu" and device_type("cuda:1") == "cuda"


def test_a_name_that_cannot_run_is_said_as_its_setting_writes_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match=r"^--device cuda:0: no CUDA device is available$"):
        resolve_device("cuda:0", "--device")
    with pytest.raises(UserError, match=r"^train.device is 'cuda' but no CUDA device is available$"):
        resolve_device("cuda", "train.device", local_rank=0)
    with pytest.raises(UserError, match=r"^--device must be auto, cpu, cuda or cuda:N \(got 'gpu'\)$"):
        resolve_device("gpu")


def test_one_process_gets_the_device_as_named_and_a_rank_its_local_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda") == torch.device("cuda") and resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("cuda", "train.device", local_rank=1, world=2) == torch.device("cuda", 1)
    with pytest.raises(UserError, match=r"^--device cuda:2: this machine has 2 CUDA device\(s\), numbered from 0$"):
        resolve_device("cuda:2")
