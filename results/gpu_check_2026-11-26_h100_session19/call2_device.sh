#!/bin/bash
# call 2: why the demo's first epoch is slow on the GPU (45 s against 4 s for the second in call 1): the relative
# demo with an empty and then a warm Triton cache, the absolute demo (no Triton), each to update 160 (epoch 2 starts
# at about 150); then the 3,125-token profile again, its files in one archive
cd "$(dirname "$0")/../.."
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH="$PWD:/tmp/site"
python -m rpr_mt.cli prepare --config configs/demo.yaml --no-progress --set data.output_dir=/tmp/demo_data > /dev/null 2>&1
demo() {  # name, TRITON_CACHE_DIR, extra --set
  TRITON_CACHE_DIR=$2 timeout 100 python -m rpr_mt.cli train --config configs/demo.yaml --no-progress \
    --set data.output_dir=/tmp/demo_data --set train.run_dir=/tmp/run_$1 --set train.device=cuda \
    --set train.precision=bf16 --set train.max_steps=160 --set train.validate_every=1000 --set train.save_every=1000 \
    --set train.log_every=10 $3 > $OUT/$1.log 2>&1
  echo "rc $?; triton cache entries $(ls $2 2>/dev/null | wc -l)" >> $OUT/$1.log
  stamp "$1"; grep -E "^update (1|10|20|30|50|100|150|160) " $OUT/$1.log | awk '{print $2, $NF, $(NF-3)}' | tr '\n' ' '; tail -1 $OUT/$1.log
}
demo 2a_relative_cold /tmp/tc1 ""
demo 2b_relative_warm /tmp/tc1 ""
demo 2c_absolute /tmp/tc2 "--set model.positions=absolute"
stamp "profile 3,125"
TRITON_CACHE_DIR=/tmp/tc1 timeout 120 python benchmarks/bench_gpu_train.py --schemes absolute relative-triton \
  --max-tokens 3125 --repeats 2 --profile /tmp/prof > $OUT/3_train_profile.md 2>&1
tail -3 $OUT/3_train_profile.md
tar czf $OUT/3_prof.tar.gz -C /tmp prof
stamp done
