#!/usr/bin/env bash
# --enable-deterministic-inference on the GPU (#22 item 6), binaries prebuilt (CUDA ON) in BIN_DIR:
#  1. test_cuda DeterministicOps.* / DeterministicEngine.*: linear, fused decode ops and LM head
#     rows bit-identical for any M; attention rows bit-identical under chunking / mixed batches /
#     decode (bf16 and FP8 caches); the demo model's greedy tokens and logprob bits under load
#     (chunking, mixed batches, retraction, CUDA graphs) equal to one-at-a-time runs; and
#     CudaAttention.SlidingWindow: every attention kernel with a sliding window vs the CPU;
#  2. the mode's cost: `bench` on Llama-3.1-8B shapes (random weights) with and without
#     --deterministic in one command, CUDA graphs, prefill 1k/8k and decode batch 1/64 at 1k/8k.
# Usage: scripts/gpu_deterministic.sh [BIN_DIR] (default build); logs in ${OUT:-/tmp/out}.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
OUT=${OUT:-/tmp/out}
M8=${MODEL:-/tmp/l8b}
mkdir -p "$OUT"
S=$OUT/deterministic_summary.txt
: > "$S"
say() { echo "$*" | tee -a "$S"; }
mk=
if [ ! -f "$M8/config.json" ]; then  # written while the tests run
  timeout 240 "$B/tokenspeed" make-random-model --preset llama-3.1-8b --out "$M8" > "$OUT/det_mk.log" 2>&1 &
  mk=$!
fi
timeout 300 "$B/test_cuda" --gtest_filter='DeterministicOps.*:DeterministicEngine.*:CudaAttention.SlidingWindow' > "$OUT/det_test.log" 2>&1
say "test_cuda deterministic: rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED|differ|Failure" "$OUT/det_test.log" | head -40 | tee -a "$S"
[ -n "$mk" ] && wait "$mk"
for mode in default deterministic; do
  flag=
  [ "$mode" = deterministic ] && flag=--deterministic
  timeout 400 "$B/tokenspeed" bench --model "$M8" --device cuda --graphs $flag --prompt-lens 1024,8192 \
    --batches 1,64 --contexts 1024,8192 --json "$OUT/det_bench_$mode.json" > "$OUT/det_bench_$mode.log" 2>&1
  say "bench $mode: rc=$?"
  grep -E "^\| (prefill|decode)" "$OUT/det_bench_$mode.log" | sed "s/^/[$mode] /" | tee -a "$S"
done
