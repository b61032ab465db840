#!/usr/bin/env bash
# EAGLE3 on the GPU machine (prebuilt binaries in .device, scripts/device_bundle.sh): the
# speculative CUDA tests, the demo-pair check (GPU vs CPU acceptance), bench-spec on the demo
# pair at batch 1/8/32 (golden prompts and generated code prompts), and the Llama-3.1-8B-shaped
# random pair (overhead of the draft loop; acceptance is meaningless with random weights).
# Logs go to $OUT. Steps: a comma list of tests,demo,bench,bench8b (default all).
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=.device/bin
[ -d $B ] || tar -C .device -xJf .device/bin.tar.xz
OUT=${OUT:-/tmp/out}
STEPS=${1:-tests,demo,lab,bench,bench8b}
quiet() { tr '\r' '\n' | grep -v -E "^\[[0-9]|Capturing|^$"; }
has() { [[ ",$STEPS," == *",$1,"* ]]; }
SPEC="--speculative-algorithm EAGLE3 --speculative-num-steps 3"
if has tests; then
  timeout 240 $B/test_cuda --gtest_filter="${FILTER:-*}" > $OUT/test_cuda.log 2>&1; echo "test_cuda rc=$?"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|Failure|tests ran" $OUT/test_cuda.log | head -20
fi
if has demo; then
  python3 scripts/gpu_demo_check.py $B/tokenspeed 2>&1 | tee $OUT/demo.log
fi
if has lab && [ -x $B/lab_linear ]; then
  timeout 120 $B/lab_linear > $OUT/lab_linear.log 2>&1; echo "lab_linear rc=$?"; grep demo_ $OUT/lab_linear.log | grep -v check
fi
if has bench; then
  for P in "--prompts-json models/pycoder-eagle3/spec_golden.json" "--prompt-tokens 512"; do
    timeout 240 $B/tokenspeed bench-spec --device cuda --batches 1,8,32 --gen-tokens 256 $P $SPEC \
      --speculative-draft-model-path models/pycoder-eagle3 --max-total-tokens 200000 2>&1 | quiet | tee -a $OUT/bench_spec_demo.log
  done
fi
if has steps; then  # deeper chains: more drafts per verify against more draft forwards
  for k in 2 5; do
    timeout 120 $B/tokenspeed bench-spec --device cuda --batches 1,8 --gen-tokens 256 --spec-only \
      --prompts-json models/pycoder-eagle3/spec_golden.json --speculative-algorithm EAGLE3 --speculative-num-steps $k \
      --speculative-draft-model-path models/pycoder-eagle3 --max-total-tokens 200000 2>&1 | quiet | grep -E "^eagle3" | sed "s/^/steps=$k /" | tee -a $OUT/bench_spec_steps.log
  done
fi
if has bench8b; then
  timeout 150 $B/tokenspeed make-random-model --preset llama-3.1-8b --out /tmp/l8b > /tmp/make8b.log 2>&1; echo "make 8b rc=$?"
  timeout 60 $B/tokenspeed make-random-model --preset eagle3-llama-3.1-8b --out /tmp/d8b > /tmp/maked8b.log 2>&1; echo "make draft rc=$?"
  timeout 300 $B/tokenspeed bench-spec /tmp/l8b --device cuda --batches 1,8,32 --prompt-tokens 512 --gen-tokens 128 $SPEC \
    --speculative-draft-model-path /tmp/d8b --context-length 8192 2>&1 | quiet | tee $OUT/bench_spec_8b.log
fi
