#!/usr/bin/env bash
# Serving core (#17) on the GPU machine, binaries prebuilt in a build dir (CUDA ON):
#  1. device logits processing (penalties, logit_bias, min_tokens from per-slot token counts)
#     against the CPU sampler: tests/cuda/logits_proc_test.cpp, plus the decode-graph and
#     sampling tests it shares a path with;
#  2. end to end: `tokenspeed generate` on the demo model with penalties / min_tokens, greedy,
#     --device cuda (decode graphs, and --disable-cuda-graph) vs the same run with --logprobs 0
#     (host logits: the CPU sampler's penalties on the same GPU forward): every id must match;
#     vs --device cpu reported only (bf16 GPU vs f32 CPU may drift);
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
  gen "${name}_cuda" --device cuda $args            # device processing, decode graphs
  # shellcheck disable=SC2086
  gen "${name}_eager" --device cuda --disable-cuda-graph $args
  # shellcheck disable=SC2086
  gen "${name}_host" --device cuda --logprobs 0 $args  # logprobs: host logits, the CPU sampler's penalties
  # shellcheck disable=SC2086
  gen "${name}_hosteager" --device cuda --disable-cuda-graph --logprobs 0 $args
  # shellcheck disable=SC2086
  gen "${name}_cpu" --device cpu $args
  # Hard check: the same GPU forward, penalties on the device vs on the host: every id equal.
  for pair in cuda:host eager:hosteager; do
    d=${pair%%:*}; h=${pair#*:}
    if [ -s "$OUT/gen_${name}_$d.txt" ] && cmp -s "$OUT/gen_${name}_$h.txt" "$OUT/gen_${name}_$d.txt"; then
      same=yes; else same=NO; status=1; fi
    echo "e2e $name: $d (device penalties) == $h (host-logits path): $same" | tee -a "$OUT/gpu_core.log"
  done
  # Informational: bf16 GPU vs f32 CPU oracle (may drift after a few tokens).
  a=$(first8 "$OUT/gen_${name}_cpu.txt"); b=$(first8 "$OUT/gen_${name}_cuda.txt")
  full=$(cmp -s "$OUT/gen_${name}_cpu.txt" "$OUT/gen_${name}_cuda.txt" && echo equal || echo differ)
  echo "e2e $name: cuda vs cpu: first 8 ids $([ "$a" = "$b" ] && echo same || echo differ), all ids $full" \
    | tee -a "$OUT/gpu_core.log"
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
