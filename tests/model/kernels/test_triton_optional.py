"""Triton is optional: without it everything imports, ``impl="triton"`` is a clear error, and the default policy
falls back to the torch path; with it, the default policy picks the kernels on CUDA only (chosen by measurement on
a GPU, docs/benchmarks.md). These run in the default test run, with or without Triton installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rpr_mt.model.kernels import choose_impl

ROOT = Path(__file__).resolve().parents[3]

WITHOUT_TRITON = """
import sys
sys.modules["triton"] = None  # importing triton now raises ImportError, as when it is not installed
sys.modules["triton.language"] = None
import torch
from rpr_mt.model.kernels import relative_attention, triton_shaw
assert triton_shaw.triton is None and not triton_shaw.available(torch.zeros(1, 1, 1, 1))
q = torch.randn(1, 2, 5, 4)
table = torch.randn(2, 3, 4)
try:
    relative_attention(q, q, q, table, table, clip=1, impl="triton")
except ValueError as error:
    print(error)
"""


def test_module_imports_without_triton_and_impl_triton_says_what_to_install():
    done = subprocess.run([sys.executable, "-c", WITHOUT_TRITON], capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "impl='triton' needs the triton package (pip install 'triton>=3.2')" in done.stdout


def test_default_policy_off_cuda_never_picks_the_kernel_and_content_attention_off_the_cpu_is_sdpa():
    """A meta tensor stands for an accelerator other than CUDA: relative attention stays on the torch path (fused),
    content attention uses scaled_dot_product_attention."""
    q = torch.empty(2, 8, 128, 64, device="meta")
    for needs_grad in (True, False):
        assert choose_impl(q, 128, tables=True, needs_grad=needs_grad) == "fused"
        assert choose_impl(q, 128, tables=False, needs_grad=needs_grad) == "sdpa"


class CudaQueries:
    """Stands for a CUDA tensor of queries where there is no GPU: what choose_impl reads of one."""

    def __init__(self, q_len: int, dtype: torch.dtype = torch.bfloat16):
        self.shape, self.dtype, self.device = (2, 8, q_len, 64), dtype, torch.device("cuda")


CUDA_POLICY = """
import sys
scenario = sys.argv[1]
if scenario == "no-triton":
    sys.modules["triton"] = None
    sys.modules["triton.language"] = None
import torch
torch.cuda.get_device_capability = lambda device=None: (7, 0) if scenario == "volta" else (9, 0)
sys.path.insert(0, "tests/model/kernels")
from test_triton_optional import CudaQueries
from rpr_mt.model.kernels import choose_impl
dtype = {"fp32": torch.float32, "fp16": torch.float16}.get(scenario, torch.bfloat16)
print(choose_impl(CudaQueries(128, dtype), 128, tables=True, needs_grad=True),
      choose_impl(CudaQueries(128, dtype), 128, tables=True, needs_grad=False),
      choose_impl(CudaQueries(1, dtype), 40, tables=True, needs_grad=False),
      choose_impl(CudaQueries(128, dtype), 128, tables=False, needs_grad=True))
"""


@pytest.mark.parametrize("scenario, chosen", [
    ("bf16", "triton"),  # the measured case: bfloat16 on an sm_80+ GPU with Triton
    ("fp32", "fused"),  # not measured on a GPU
    ("fp16", "fused"),
    ("volta", "fused"),  # compute capability below 8.0
    ("opt-out", "fused"),  # RPR_MT_TRITON=0
    ("no-triton", "fused"),
])
def test_cuda_default_for_relative_attention_is_the_triton_kernel_only_where_it_was_measured(scenario, chosen):
    """Chosen by measurement on an H200 in bf16 (docs/benchmarks.md): with 8+ queries, bfloat16 Shaw attention on
    an sm_80+ GPU runs on the Triton kernels, everything else on the torch path; incremental decoding (one query)
    stays on gather, content attention on SDPA."""
    if chosen == "triton":
        pytest.importorskip("triton")
    env = {key: value for key, value in os.environ.items() if key not in ("TRITON_INTERPRET", "RPR_MT_TRITON")}
    env["PYTHONPATH"] = str(ROOT)
    if scenario == "opt-out":
        env["RPR_MT_TRITON"] = "0"
    done = subprocess.run([sys.executable, "-c", CUDA_POLICY, scenario], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [chosen, chosen, "gather", "sdpa"]


def test_a_triton_that_fails_to_import_means_the_torch_path():
    # not only ImportError: a broken install (a missing libcuda symbol, say) must not stop training
    script = CUDA_POLICY.replace('if scenario == "no-triton":', 'class Broken:\n    def find_spec(self, name, path=None, target=None):\n        if name == "triton":\n            raise RuntimeError("broken triton")\nsys.meta_path.insert(0, Broken())\nif False:')
    env = {key: value for key, value in os.environ.items() if key not in ("TRITON_INTERPRET", "RPR_MT_TRITON")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", script, "bf16"], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["fused", "fused", "gather", "sdpa"]
