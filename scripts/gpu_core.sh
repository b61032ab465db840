#!/usr/bin/env bash
# Serving core v2 (plan -> worker -> result -> apply) on the GPU machine, binaries prebuilt in a
# build dir (CUDA ON): the CUDA tests that go through the engine (decode graphs with in-graph
# sampling, EAGLE3 graph steps vs eager, TP engine + EAGLE3), then the engine host-time figure
# and a decode bench. Usage: scripts/gpu_core.sh [build-dir] (default build). Logs in ${OUT:-/tmp}.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
OUT=${OUT:-/tmp}
status=0
run() {
  echo "=== $* ===" | tee -a "$OUT/gpu_core.log"
  "$@" 2>&1 | tee -a "$OUT/gpu_core.log"
  local rc=${PIPESTATUS[0]}
  echo "=== exit $rc ===" | tee -a "$OUT/gpu_core.log"
  [ "$rc" = 0 ] || status=1
}
: > "$OUT/gpu_core.log"
# Engine-level CUDA tests: the decode graph path (PlainWorker::execute -> run_sampled), the
# EAGLE3 fixed-shape graph step (SpecWorker::decode_step) against its eager step, TP engine.
run timeout 900 "$B/test_cuda" --gtest_filter='CudaGraphs.*:SpecGraphs.*:SpecOps.*:TensorParallel.EngineAndEagle3MatchOneGpu:SamplingTest*:Sampling*'
# The CPU engine tests again on this machine (they do not need the GPU; cheap regression check).
run timeout 600 "$B/test_runtime" --gtest_filter='Engine*:Spec*:Scheduler*:KvCache*:RequestFsm*'
# EAGLE3 through the engine (the fixed-shape graph step, now reporting through StepResult).
run timeout 600 "$B/tokenspeed" bench-spec --device cuda --batches 1,8,32 --gen-tokens 128 \
  --prompts-json models/pycoder-eagle3/spec_golden.json --speculative-algorithm EAGLE3 --speculative-num-steps 3 \
  --speculative-draft-model-path models/pycoder-eagle3 --max-total-tokens 200000
# Served decode through the engine (bs64 etc.) is scripts/gpu_serve_bench.sh, unchanged.
echo "gpu_core: status $status (log $OUT/gpu_core.log)"
exit $status
