#!/usr/bin/env bash
# Parallel-layer checks on the GPU machine, from the repo root with binaries built there or
# prebuilt (scripts/gpu_session.sh / scripts/device_bundle.sh):
#   scripts/gpu_parallel.sh [build-dir]     (default: build)
# One GPU (nvidia-h200): the expert-parallel dispatch / combine kernels against the CPU ops
# (CudaEpOps.*: positions exact, folds within bf16, the -1-skipping moe_experts contract, the
# single-rank EP forward against moe_experts) and the existing MoE op tests.
# Two or more GPUs (nvidia-h200-x2 / -x4): the NCCL backend's collectives against known values,
# the unique-id (multi-node) init path, EP dispatch over GPUs against one GPU (NcclComm.*), and
# the existing TensorParallel.* tests through the Comm interface. They skip on one GPU.
# Also the CPU-backend parallel unit tests and the two-process bootstrap test.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0). Everything is tee'd to $OUT/gpu_parallel.log.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
LOG="${OUT:-/tmp}/gpu_parallel.log"
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
run timeout 900 "$BUILD_DIR/test_cuda" --gtest_filter='CudaEpOps.*:CudaMoe.*'
run timeout 900 "$BUILD_DIR/test_cuda" --gtest_filter='NcclComm.*'
run timeout 1200 "$BUILD_DIR/test_cuda" --gtest_filter='TensorParallel.*'
run timeout 900 "$BUILD_DIR/test_parallel"
run timeout 300 bash tests/cli/comm_selftest.sh "$BUILD_DIR/tokenspeed"
echo "gpu_parallel: status $status, log in $LOG" | tee -a "$LOG"
exit $status
