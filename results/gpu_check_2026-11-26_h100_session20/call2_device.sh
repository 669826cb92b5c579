#!/bin/bash
# call 2 of the fifth GPU session: direct launches (triton_launch.Launcher) and float32 tables read as they are;
# the GPU tests, the host time per call, and base-model training at 3,125 tokens, old (aa366e1, ./old_code) against
# new, alternating
cd "$(dirname "$0")/../.."
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
budget() { [ $(( $(date +%s) - T0 )) -lt $1 ] || { stamp "skipped: $2"; return 1; }; }
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH="$PWD:/tmp/site"
TRITON_CACHE_DIR=/tmp/tc timeout 150 python -m pytest -q -p no:cacheprovider tests/model/kernels/test_gpu.py \
  > $OUT/2_tests.txt 2>&1; echo "rc $?" >> $OUT/2_tests.txt; stamp "gpu tests"; tail -3 $OUT/2_tests.txt
TRITON_CACHE_DIR=/tmp/tc timeout 90 python -m pytest -q -p no:cacheprovider tests/model/kernels/test_triton_shaw.py \
  -k "wider or matches_reference or shared_and" > $OUT/2_tests_shaw.txt 2>&1; echo "rc $?" >> $OUT/2_tests_shaw.txt
stamp "shaw tests"; tail -3 $OUT/2_tests_shaw.txt
TRITON_CACHE_DIR=/tmp/tc timeout 60 python benchmarks/bench_triton_launch.py > $OUT/2_launch.md 2>&1
echo "rc $?" >> $OUT/2_launch.md; stamp "launch"; cat $OUT/2_launch.md
train() {  # label, code dir, cache
  (cd $2 && PYTHONPATH="$PWD:/tmp/site" TRITON_CACHE_DIR=$3 timeout 100 python benchmarks/bench_gpu_train.py \
    --schemes absolute relative-triton --max-tokens 3125 --repeats 2 --json $OUT/2_train_$1.json > $OUT/2_train_$1.md 2>&1)
  stamp "train $1"; grep "| base" $OUT/2_train_$1.md
}
for i in 1 2; do
  budget 420 "train round $i" || break
  train old$i old_code /tmp/tc_old
  train new$i . /tmp/tc
done
stamp done
