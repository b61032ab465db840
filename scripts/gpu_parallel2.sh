#!/usr/bin/env bash
# Parallel layers (#20) on ONE GPU (the multi-GPU kinds are not lent; TP 1 paths unchanged is the
# lead's full CUDA run). Binaries prebuilt in a build dir with CUDA ON. Checks, each fatal:
#  1. the EP dispatch / combine CUDA kernels against the CPU ops (plan / pack / expand positions
#     exact, fold within bf16 rounding, the -1-skipping experts op, the one-rank EP forward) and
#     the MoE kernels they feed: test_cuda CudaEpOps.* CudaMoe.*;
#  2. new on CUDA at one rank: SpanGather (dense / MoE TP over whole attention-DP groups: row
#     counts through the device, bf16 rows and i32 ids gathered and taken back bit-exact, zero
#     rows) and group_sharded_forward with groups of one: test_cuda CudaSpanGather.*;
#  3. the model files' dense MLPs now go through dense_mlp (blocks.h) and the MoE models build
#     their MoeParallel by world size: verify-golden on the GPU at TP 1 for a dense, a MoE and an
#     MLA fixture (atol 0.1 as gpu_parallel.sh) must still pass;
#  4. attention DP is CPU-only so far: `generate --device cuda --data-parallel-size 2` must be a
#     startup error naming --device cpu (not a crash or a hang).
# Usage: scripts/gpu_parallel2.sh [BIN_DIR] (default build; holds tokenspeed and test_cuda). Logs
# in ${OUT:-/tmp}/gpu_parallel2*.log; prints one ok/FAIL line per check and exits non-zero on any
# FAIL. Whole run: well under 4 minutes.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
B=${1:-build}
OUT=${OUT:-/tmp}
D=tests/data
mkdir -p "$OUT"
fails=0
log="$OUT/gpu_parallel2.log"
: > "$log"
check() {  # check NAME CMD...: the command must exit 0
  local name=$1; shift
  echo "=== $name: $* ===" >> "$log"
  if timeout 200 "$@" > "$OUT/gpu_parallel2_$name.log" 2>&1; then
    echo "ok:   $name ($(grep -E 'PASSED|PASS|tests? ran' "$OUT/gpu_parallel2_$name.log" | tail -1))"
  else
    echo "FAIL: $name (rc $?)"
    grep -E 'FAILED|Failure|error|FAIL' "$OUT/gpu_parallel2_$name.log" | head -8
    fails=$((fails + 1))
  fi
  cat "$OUT/gpu_parallel2_$name.log" >> "$log"
}
nvidia-smi -L 2>/dev/null | head -2
[ -x "$B/test_cuda" ] || { echo "FAIL: $B/test_cuda missing"; exit 1; }
[ -x "$B/tokenspeed" ] || { echo "FAIL: $B/tokenspeed missing"; exit 1; }
# 1-2. Kernel tests (a test that skips for want of a GPU would print SKIPPED: count them as FAIL).
check ep_ops "$B/test_cuda" --gtest_filter='CudaEpOps.*:CudaMoe.*:CudaSpanGather.*'
if grep -q "SKIPPED" "$OUT/gpu_parallel2_ep_ops.log"; then
  echo "FAIL: ep_ops skipped tests (no GPU seen?)"; fails=$((fails + 1))
fi
grep -q "CudaSpanGather.OneRankRoundTripOnTheDevice" "$OUT/gpu_parallel2_ep_ops.log" ||
  { echo "FAIL: CudaSpanGather did not run (test_cuda built before it was added?)"; fails=$((fails + 1)); }
# 3. TP 1 goldens through the changed model files.
for f in llama3 qwen3_moe deepseek_v3 qwen3_moe_fp8; do
  check "golden_$f" "$B/tokenspeed" verify-golden "$D/$f" --device cuda --atol 0.1
done
# 4. Attention DP on CUDA: a clear startup error.
out=$(timeout 120 "$B/tokenspeed" generate --model "$D/deepseek_v3" --device cuda --prompt-ids 1,2,3 --max-tokens 2 \
  --data-parallel-size 2 2>&1)
rc=$?
echo "$out" >> "$log"
if [ $rc -ne 0 ] && [ $rc -lt 124 ] && echo "$out" | grep -q "runs on CPU ranks only so far (--device cpu)"; then
  echo "ok:   dp_on_cuda_refused"
else
  echo "FAIL: dp_on_cuda_refused (rc $rc): $(echo "$out" | tail -2)"
  fails=$((fails + 1))
fi
[ $fails -eq 0 ] || { echo "gpu_parallel2: $fails FAIL(s)"; exit 1; }
echo "gpu_parallel2: all passed"
