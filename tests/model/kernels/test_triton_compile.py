"""The Triton kernels lower to H100 machine code: ahead-of-time compilation for sm_90 (ptxas is bundled with
Triton), which needs no GPU. The interpreter checks what the kernels compute; this checks what it cannot: that
every option is legal on the GPU (tile shapes, dot operand types, the gathered loads, barriers, atomics, Philox).

It compiles in a subprocess without TRITON_INTERPRET (the interpreter replaces the compiler at import), about a
minute on a 2-core CPU, so it is marked slow as well as triton:

    python -m pytest -m triton tests/model/kernels/test_triton_compile.py -s    # -s prints registers and spills
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[triton]')")

pytestmark = [pytest.mark.triton, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]

COMPILE = """
import json, sys
from rpr_mt.model.kernels.triton_shaw import compile_for
print(json.dumps(compile_for(**json.loads(sys.argv[1]))))
"""

VARIANTS = {
    # training in bf16: both tables, a padding/causal mask, seeded dropout, a learned bias broadcast over queries
    "bf16-KV-mask-dropout-bias": dict(dtype="bf16", HAS_BIAS=True, BIAS_GRAD=2, ROW_BC=True),
    # float32 (the exactness check on a GPU): K only, no mask, an explicit keep mask
    "fp32-K-keep": dict(dtype="fp32", HAS_V=False, HAS_MASK=False, DROPOUT=2),
}


@pytest.mark.parametrize("variant", list(VARIANTS), ids=list(VARIANTS))
def test_kernels_compile_for_h100(variant):
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", COMPILE, json.dumps(dict(arch=90, **VARIANTS[variant]))],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print(variant, report)
    assert set(report) == {"_shaw_fwd", "_shaw_bwd_pre", "_shaw_bwd_dkdv", "_shaw_bwd_dq", "_shaw_bwd_serial"}
    assert all(entry["cubin_bytes"] > 0 for entry in report.values())
