#!/usr/bin/env bash
# Serving core (#17) on the GPU machine, binaries prebuilt in a build dir (CUDA ON):
#  1. device logits processing (penalties, logit_bias, min_tokens from per-slot token counts)
#     against the CPU sampler: tests/cuda/logits_proc_test.cpp, plus the decode-graph and
#     sampling tests it shares a path with;
#  2. end to end: `tokenspeed generate` on the demo model with penalties / min_tokens, greedy,
#     --device cuda (decode graphs, and --disable-cuda-graph) vs --device cpu: the ids must match
#     (a bf16 GPU forward may legitimately diverge from the f32 CPU oracle after some tokens, so
#     the first 8 ids are the hard check, the whole list is reported);
#  3. the engine-level CUDA tests (graphs, EAGLE3, TP) and the EAGLE3 bench, as before.
# Usage: scripts/gpu_core.sh [BIN_DIR] (default build; holds tokenspeed and test_cuda). Logs in
# ${OUT:-/tmp}; key lines are printed.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
OUT=${OUT:-/tmp}
mkdir -p "$OUT"
status=0
run() {
  echo "=== $* ===" | tee -a "$OUT/gpu_core.log"
  "$@" 2>&1 | tee -a "$OUT/gpu_core.log"
  local rc=${PIPESTATUS[0]}
  echo "=== exit $rc ===" | tee -a "$OUT/gpu_core.log"
  [ "$rc" = 0 ] || status=1
}
: > "$OUT/gpu_core.log"
# 1. Device logits processing vs the CPU sampler; graphs and samplers it touches.
run timeout 300 "$B/test_cuda" --gtest_filter='CudaLogitsProc*:CudaSampling.*:CudaBitmask.*'
run timeout 600 "$B/test_cuda" --gtest_filter='CudaGraphs.*'
# 2. End to end: penalties on the device (graphs and eager) vs the CPU.
gen() {  # gen NAME ARGS...: ids of a greedy generation into $OUT/gen_NAME.txt
  local name=$1; shift
  timeout 300 "$B/tokenspeed" generate --prompt "def fibonacci(n):" --max-tokens 48 --print-ids "$@" \
    > "$OUT/gen_$name.txt" 2> "$OUT/gen_$name.err"
  local rc=$?
  echo "generate $name rc=$rc: $(tr -d '\n' < "$OUT/gen_$name.txt" | head -c 400)"
  [ $rc = 0 ] || { status=1; tail -5 "$OUT/gen_$name.err"; }
}
first8() { tr -d '[] \n' < "$1" | cut -d, -f1-8; }
for cfg in "rep:--repetition-penalty 1.3" "pres:--presence-penalty 0.8 --frequency-penalty 0.4" \
           "all:--repetition-penalty 1.1 --presence-penalty 0.3 --frequency-penalty 0.2 --min-tokens 40" \
           "none:"; do
  name=${cfg%%:*}; args=${cfg#*:}
  # shellcheck disable=SC2086
  gen "${name}_cpu" --device cpu $args
  # shellcheck disable=SC2086
  gen "${name}_cuda" --device cuda $args
  # shellcheck disable=SC2086
  gen "${name}_eager" --device cuda --disable-cuda-graph $args
  for d in cuda eager; do
    a=$(first8 "$OUT/gen_${name}_cpu.txt"); b=$(first8 "$OUT/gen_${name}_$d.txt")
    if [ -n "$a" ] && [ "$a" = "$b" ]; then same=yes; else same=NO; status=1; fi
    full=$(cmp -s "$OUT/gen_${name}_cpu.txt" "$OUT/gen_${name}_$d.txt" && echo equal || echo differ)
    echo "e2e $name $d vs cpu: first 8 ids same=$same, all ids $full" | tee -a "$OUT/gpu_core.log"
  done
done
if cmp -s "$OUT/gen_rep_cuda.txt" "$OUT/gen_none_cuda.txt"; then
  echo "e2e: WARNING repetition penalty changed nothing on cuda" | tee -a "$OUT/gpu_core.log"
fi
# 3. Engine-level CUDA tests (decode graphs with in-graph sampling, EAGLE3 graph step, TP).
run timeout 900 "$B/test_cuda" --gtest_filter='SpecGraphs.*:SpecOps.*:TensorParallel.EngineAndEagle3MatchOneGpu'
run timeout 600 "$B/tokenspeed" bench-spec --device cuda --batches 1,8,32 --gen-tokens 128 \
  --prompts-json models/pycoder-eagle3/spec_golden.json --speculative-algorithm EAGLE3 --speculative-num-steps 3 \
  --speculative-draft-model-path models/pycoder-eagle3 --max-total-tokens 200000
echo "gpu_core: status $status (log $OUT/gpu_core.log)"
exit $status
