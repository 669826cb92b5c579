#!/bin/bash
# call 1 of the fifth GPU session: where the Triton path's host time goes, launcher against compiled kernel
cd "$(dirname "$0")/../.."
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH="$PWD:/tmp/site"
python -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee $OUT/versions.txt
nvidia-smi -L >> $OUT/versions.txt
export TRITON_CACHE_DIR=/tmp/tc
timeout 150 python benchmarks/bench_triton_launch.py > $OUT/1_launch.md 2>&1; echo "rc $?" >> $OUT/1_launch.md
stamp launch; cat $OUT/1_launch.md
timeout 60 python benchmarks/profile_gpu_host.py --calls 50 --top 30 > $OUT/1_host_profile.txt 2>&1
stamp profile; tail -1 $OUT/1_host_profile.txt
