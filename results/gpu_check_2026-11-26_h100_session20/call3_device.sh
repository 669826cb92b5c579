#!/bin/bash
# call 3 of the fifth GPU session: the mixed-dtype tests that call 2's time limit cut off (float64 tables with float32
# q, k, v; float32 tables under bf16 autocast), then the host-time benchmark once more
cd "$(dirname "$0")/../.."
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH="$PWD:/tmp/site" TRITON_CACHE_DIR=/tmp/tc
timeout 150 python -m pytest -q -p no:cacheprovider tests/model/kernels/test_gpu.py tests/model/kernels/test_triton_shaw.py \
  -k "autocast or wider" > $OUT/3_tests.txt 2>&1; echo "rc $?" >> $OUT/3_tests.txt; stamp tests; tail -3 $OUT/3_tests.txt
timeout 40 python benchmarks/bench_triton_launch.py > $OUT/3_launch.md 2>&1; echo "rc $?" >> $OUT/3_launch.md
stamp launch; cat $OUT/3_launch.md
