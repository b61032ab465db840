#!/usr/bin/env bash
# Tensor-parallel checks, run ON the 2-GPU machine (nvidia-h200-x2) from the repo root with
# binaries prebuilt elsewhere (see scripts/gpu_session.sh / scripts/device_bundle.sh):
#   scripts/gpu_tp_check.sh [build-dir]     (default: build)
# 1. the TP gtests (tests/cuda/tp_test.cpp, filter TensorParallel.*) + the single-GPU CUDA tests
#    that touch the per-thread device/stream changes (graphs, attention, linear, norm);
# 2. lab_allreduce: fused one-shot all-reduce + norm vs NCCL + norm, 1..2048 tokens x 4096;
# 3. bench-decode on a random llama-3.1-8b checkpoint: TP=1, TP=2 (vocab-parallel) and TP=2
#    (--replicate-embedding), eager and CUDA graphs: batch-1 decode tok/s and memory per GPU.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0). Everything is tee'd to $OUT/gpu_tp_check.log.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
LOG="${OUT:-/tmp}/gpu_tp_check.log"
mkdir -p "$(dirname "$LOG")"
: > "$LOG"
export NCCL_NVLS_ENABLE=0
status=0
run() {
  echo "=== $* ===" | tee -a "$LOG"
  "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  echo "=== exit $rc: $* ===" | tee -a "$LOG"
  [ "$rc" = 0 ] || status=1
}
run nvidia-smi
run nvidia-smi topo -m
TS="$BUILD_DIR/tokenspeed"
run timeout 1200 "$BUILD_DIR/test_cuda" --gtest_filter='TensorParallel.*'
run timeout 1200 "$BUILD_DIR/test_cuda" --gtest_filter='CudaGraphs.*:*Attention*:*Linear*:*Norm*'
[ -x "$BUILD_DIR/lab_allreduce" ] && run timeout 600 "$BUILD_DIR/lab_allreduce" 4096 200
L8B=/tmp/l8b
[ -f "$L8B/config.json" ] || run "$TS" make-random-model --preset llama-3.1-8b --out "$L8B"
for args in "--tp-size 1" "--tp-size 2" "--tp-size 2 --replicate-embedding"; do
  # shellcheck disable=SC2086
  run timeout 900 "$TS" bench-decode --model "$L8B" --device cuda --prompt-tokens 512 --gen-tokens 128 --graphs $args
done
echo "gpu_tp_check: status $status, log in $LOG" | tee -a "$LOG"
exit $status
