#!/bin/bash
# call 2 of the sixth GPU session (one H200, a fresh machine): base-model training relative/absolute at 12,500
# tokens (the docs' advice for an update spread over two GPUs, never measured) and again at 25,000 and 3,125 (the
# spread between calls), 5 alternating repeats each, with a profile of the first repeat of the 12,500 and 25,000 rows (GPU-busy share)
cd "$(dirname "$0")/../.."
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
budget() { [ $(( $(date +%s) - T0 )) -lt $1 ] || { stamp "skipped: $2"; return 1; }; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH="$PWD:/tmp/site" TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
nvidia-smi -L
train() {  # tokens, repeats, extra
  timeout 120 python3 benchmarks/bench_gpu_train.py --schemes absolute relative-triton --max-tokens $1 --repeats $2 $3 \
    --json $OUT/2_train$1.json >> $OUT/2_train.md 2>&1; echo "rc $?" >> $OUT/2_train.md
  stamp "train $1"; grep "| base\|profile of" $OUT/2_train.md | tail -4
}
train 12500 5 "--profile $OUT/prof"
budget 150 "train 25000" && train 25000 5 "--profile $OUT/prof"
budget 200 "train 3125" && train 3125 5
stamp done
