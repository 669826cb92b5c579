#!/bin/bash
# call 1 of the fourth GPU session: the compile test with a per-head bias, where a training update's time goes
# (bench_gpu_train --profile), the demo's first-epoch time with the compile fix (empty Triton cache), the big preset
cd "$(dirname "$0")/../.."
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
budget() { [ $(( $(date +%s) - T0 )) -lt $1 ] || { stamp "skipped: $2"; return 1; }; }
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -1
export PYTHONPATH="$PWD:/tmp/site"
nvidia-smi -L > $OUT/nvidia_smi.txt; nvidia-smi >> $OUT/nvidia_smi.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee $OUT/versions.txt
stamp "compile test"
TRITON_CACHE_DIR=/tmp/tc_tests timeout 90 python -m pytest -q -x -p no:cacheprovider tests/model/kernels/test_gpu.py -k compile > $OUT/1_tests.txt 2>&1; echo "rc $?" >> $OUT/1_tests.txt
tail -3 $OUT/1_tests.txt
stamp "demo bf16, empty Triton cache"
export TRITON_CACHE_DIR=/tmp/tc_demo
python -m rpr_mt.cli prepare --config configs/demo.yaml --no-progress --set data.output_dir=/tmp/demo_data > $OUT/2_demo_prepare.log 2>&1
timeout 120 python -m rpr_mt.cli train --config configs/demo.yaml --no-progress --set data.output_dir=/tmp/demo_data \
  --set train.run_dir=/tmp/demo_run --set train.device=cuda --set train.precision=bf16 --set train.max_steps=300 \
  --set train.validate_every=300 --set train.save_every=300 --set train.log_every=25 > $OUT/2_demo_train.log 2>&1
echo "rc $?" >> $OUT/2_demo_train.log
grep -E "^update|rc" $OUT/2_demo_train.log | head -14
stamp "train profile"
export TRITON_CACHE_DIR=/tmp/tc_bench
timeout 200 python benchmarks/bench_gpu_train.py --schemes absolute relative-triton --max-tokens 3125 25000 \
  --profile $OUT/prof --json $OUT/3_train.json > $OUT/3_train.md 2>&1
cat $OUT/3_train.md | tail -15
budget 330 "big" && timeout 110 python benchmarks/bench_gpu_train.py --presets big --schemes absolute relative-triton \
  --max-tokens 3125 --repeats 2 --json $OUT/4_big.json > $OUT/4_big.md 2>&1
tail -8 $OUT/4_big.md
stamp "done"
