#!/bin/bash
# call 1 of the sixth GPU session (one H200): the GPU tests with RuntimeWarning as an error (a launcher fallback
# shows), the first GPU run of the masks prepared once per stack and the cross mask decided in encode; base-model
# training relative/absolute at 3,125 tokens (7 alternating repeats, and a profile: how busy the GPU is) and at
# 25,000; then `rpr-mt train` + `eval-bleu` of the demo in bf16 and fp16 on the Triton default.
cd "$(dirname "$0")/../.."
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/log.txt; }
budget() { [ $(( $(date +%s) - T0 )) -lt $1 ] || { stamp "skipped: $2"; return 1; }; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH="$PWD:/tmp/site" TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
{ python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"; nvidia-smi -L; } >> $OUT/log.txt 2>&1
timeout 220 python3 -W error::RuntimeWarning -m pytest -q -p no:cacheprovider -m gpu tests/model/kernels/test_gpu.py \
  > $OUT/1_tests.txt 2>&1; echo "rc $?" >> $OUT/1_tests.txt; stamp "gpu tests"; tail -3 $OUT/1_tests.txt
train() {  # tokens, repeats, extra
  timeout 150 python3 benchmarks/bench_gpu_train.py --schemes absolute relative-triton --max-tokens $1 --repeats $2 \
    --json $OUT/1_train$1.json $3 >> $OUT/1_train.md 2>&1; echo "rc $?" >> $OUT/1_train.md
  stamp "train $1"; grep "| base" $OUT/1_train.md | tail -2
}
budget 300 "train 3125" && train 3125 7 "--profile $OUT/prof"
budget 380 "train 25000" && train 25000 3 ""
budget 420 "trainer" && timeout 170 scripts/gpu_check.sh --parts trainer --out $OUT/1_trainer.md > /dev/null 2>&1
stamp "trainer rc $?"; grep "^|" $OUT/1_trainer.md | head -12
stamp done
