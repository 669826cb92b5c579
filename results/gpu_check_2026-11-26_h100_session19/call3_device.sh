#!/bin/bash
# call 3: content attention without SDPA's cuDNN backend (working tree): the GPU test that no cuDNN kernel runs, the
# demo's first epoch again (absolute), the 3,125-token training ratio, the relative demo if time is left
cd "$(dirname "$0")/../.."
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
budget() { [ $(( $(date +%s) - T0 )) -lt $1 ] || { stamp "skipped: $2"; return 1; }; }
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH="$PWD:/tmp/site"
python -m rpr_mt.cli prepare --config configs/demo.yaml --no-progress --set data.output_dir=/tmp/demo_data > /dev/null 2>&1 &
timeout 40 python -m pytest -q -p no:cacheprovider tests/model/kernels/test_gpu.py -k "content_attention" > $OUT/3_tests.txt 2>&1
echo "rc $?" >> $OUT/3_tests.txt; stamp "tests"; tail -2 $OUT/3_tests.txt
wait
demo() {  # name, TRITON_CACHE_DIR, extra --set
  TRITON_CACHE_DIR=$2 timeout 60 python -m rpr_mt.cli train --config configs/demo.yaml --no-progress \
    --set data.output_dir=/tmp/demo_data --set train.run_dir=/tmp/run_$1 --set train.device=cuda \
    --set train.precision=bf16 --set train.max_steps=160 --set train.validate_every=1000 --set train.save_every=1000 \
    --set train.log_every=10 $3 > $OUT/$1.log 2>&1
  echo "rc $?" >> $OUT/$1.log
  stamp "$1"; grep -E "^update" $OUT/$1.log | sed -E 's/update ([0-9]+) \| epoch ([0-9]+).*\| ([0-9,]+) tgt tok\/s.*\| ([0-9.]+)s \|.*/\1:e\2:\3:\4s/' | tr '\n' ' '; echo
}
demo 3a_absolute /tmp/tc0 "--set model.positions=absolute"
budget 100 "bench" && TRITON_CACHE_DIR=/tmp/tc1 timeout 75 python benchmarks/bench_gpu_train.py --schemes absolute relative-triton \
  --max-tokens 3125 --repeats 2 --json $OUT/3c_train.json > $OUT/3c_train.md 2>&1
tail -3 $OUT/3c_train.md
budget 170 "relative demo" && demo 3b_relative_cold /tmp/tc1 ""
stamp done
