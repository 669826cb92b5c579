#!/usr/bin/env bash
# One command for a GPU machine (about 6 minutes on one H200, plus its start): the GPU unit tests, `rpr-mt train` and
# `eval-bleu` on CUDA (the demo in bf16 and fp16; with --multi30k-dir the literature recipe), torchrun with NCCL, the
# training benchmark of the relative and absolute base models (tokens/s, peak memory) and the attention benchmark
# (the Triton kernel vs the torch path vs SDPA flash, L = 64 ... 1024), printed as one table and written to
# runs/gpu_check/<time>.md for docs/benchmarks.md. Arguments go to scripts/gpu_check.py (--help; --dry-run needs no
# GPU). Needs the package's dependencies and Triton: pip install -e ".[dev,triton]". Runs $PYTHON if set (e.g.
# PYTHON=.venv/bin/python for a virtualenv that is not activated), else python3 from PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout, even where another one is installed
exec "${PYTHON:-python3}" scripts/gpu_check.py "$@"
