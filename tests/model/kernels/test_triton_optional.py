"""Triton is optional: without it everything imports, ``impl="triton"`` is a clear error, and the default policy
never picks the kernels (dispatch by measurement: until a GPU benchmark shows them faster, the torch path stays).
These run in the default test run, with or without Triton installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
    assert "impl='triton' needs the triton package (pip install 'rpr-mt[triton]')" in done.stdout


def test_default_policy_never_picks_the_kernel_and_content_attention_off_the_cpu_is_sdpa():
    """A meta tensor stands for a CUDA one: relative attention stays on the torch path (fused), content attention
    uses scaled_dot_product_attention (FlashAttention on CUDA)."""
    q = torch.empty(2, 8, 128, 64, device="meta")
    for needs_grad in (True, False):
        assert choose_impl(q, 128, tables=True, needs_grad=needs_grad) == "fused"
        assert choose_impl(q, 128, tables=False, needs_grad=needs_grad) == "sdpa"
