#!/bin/bash
# one GPU call: the specialization fix and host trims (working tree) against HEAD (a220d0f, in .baseline/)
cd "$(dirname "$0")/.."
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
budget() { [ $(( $(date +%s) - T0 )) -lt $1 ] || { stamp "skipped: $2"; return 1; }; }
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -1
NEW="$PWD:/tmp/site"; OLD="$PWD/.baseline:/tmp/site"
nvidia-smi -L > $OUT/nvidia_smi.txt; nvidia-smi >> $OUT/nvidia_smi.txt
PYTHONPATH=$NEW python -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee $OUT/versions.txt
stamp "tests"
PYTHONPATH=$NEW TRITON_CACHE_DIR=/tmp/tc_tests timeout 100 python -m pytest -q -x -p no:cacheprovider tests/model/kernels/test_gpu.py > $OUT/1_tests.txt 2>&1; echo "rc $?" >> $OUT/1_tests.txt
tail -3 $OUT/1_tests.txt
stamp "compiles"
PYTHONPATH=$NEW TRITON_CACHE_DIR=/tmp/tc_new timeout 100 python benchmarks/bench_triton_compiles.py --calls 200 --json $OUT/2_compiles_new.json > $OUT/2_compiles_new.txt 2>&1
PYTHONPATH=$OLD TRITON_CACHE_DIR=/tmp/tc_old timeout 110 python benchmarks/bench_triton_compiles.py --calls 200 --json $OUT/2_compiles_old.json > $OUT/2_compiles_old.txt 2>&1
tail -2 $OUT/2_compiles_new.txt $OUT/2_compiles_old.txt
stamp "train"
PYTHONPATH=$NEW TRITON_CACHE_DIR=/tmp/tc_new timeout 170 python benchmarks/bench_gpu_train.py --schemes absolute relative-triton --json $OUT/4_train_new.json > $OUT/4_train_new.md 2>&1
cat $OUT/4_train_new.md
budget 380 "old train" && PYTHONPATH=$OLD TRITON_CACHE_DIR=/tmp/tc_old timeout 170 python benchmarks/bench_gpu_train.py --schemes absolute relative-triton --json $OUT/4_train_old.json > $OUT/4_train_old.md 2>&1
cat $OUT/4_train_old.md
stamp "host"
budget 500 "host" && PYTHONPATH=$NEW TRITON_CACHE_DIR=/tmp/tc_new timeout 30 python benchmarks/profile_gpu_host.py --calls 50 --top 30 > $OUT/3_host_new.txt 2>&1
budget 530 "host old" && PYTHONPATH=$OLD TRITON_CACHE_DIR=/tmp/tc_old timeout 30 python benchmarks/profile_gpu_host.py --calls 50 --top 30 > $OUT/3_host_old.txt 2>&1
tail -1 $OUT/3_host_new.txt $OUT/3_host_old.txt
stamp "done"
