#!/usr/bin/env bash
# Quantized checkpoints on the GPU (issue #16). FP8 (block-128, per-channel, per-tensor, MXFP8)
# and NVFP4 linear weights stay as stored on CUDA (src/ops/cuda/quant_linear.cu: W8A16 / W4A16
# GEMV and tensor-core W8A16 for decode, dequantized bf16 tiles + cuBLASLt for prefill); so do the
# routed MoE experts (src/ops/cuda/moe.cu: grouped GEMV over the active experts' stored bytes for
# decode, dequantized expert chunks + the bf16 grouped GEMM for prefill). In order (most
# important first):
#  1. test_cuda: the FP8 kernels and the quantized experts vs the CPU oracle (and the existing
#     linear and MoE tests);
#  2. tokenspeed bench --moe-lab: one MoE layer at Qwen3-30B-A3B shapes, bf16 vs FP8 vs NVFP4
#     experts, time per layer and GB/s over the experts read vs the copy ceiling of the same run;
#  3. verify-golden --device cuda on every quantized fixture (weight-only tolerance 0.1) and, for
#     comparison in the same run, the bf16 MoE twins; route-diff --device cuda on the quantized
#     MoE fixtures (routing flips: why the long prompt exceeds the tolerance); --linear-lab: FP8 vs bf16
#     linears at Llama-3.1-8B shapes, GB/s of the stored bytes and % of the copy ceiling
#     measured in the same run;
#  4. random quantized models of each format load and decode;
#  5. decode tok/s of a random Llama-3.1-8B-shaped checkpoint, FP8 block-128 vs bf16 vs NVFP4;
#  6. decode tok/s of a random Qwen3-30B-A3B-shaped checkpoint (4 of 48 layers, all 128 experts),
#     FP8 block-128 vs bf16 (SKIP_MOE_E2E=1 skips it).
# Usage: scripts/gpu_quant.sh BIN_DIR (holding tokenspeed and test_cuda; or $BIN_DIR). Logs go to
# $OUT (default /tmp/out). Runs from the checkout holding it, else from the current directory (a
# checkout with tests/data). Step 5 uses 8 of the 32 layers unless FULL_8B=1 (then it writes
# 16 + 8 + 5 GB of random checkpoints; minutes); SKIP_8B=1 skips it.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
[ -d "$here/tests/data" ] && cd "$here"
B=${1:-${BIN_DIR:?usage: scripts/gpu_quant.sh BIN_DIR}}
B=$(cd "$B" && pwd)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
rc=0
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
# A compact SUMMARY at the very end (also when a step or the caller's timeout ends the script)
# and every log in one file, $OUT/logs.tgz.
summary() {
  trap - EXIT TERM INT
  echo; echo "=================== SUMMARY (gpu_quant.sh, $(date -u +%H:%M:%S), rc=$rc)"
  if [ -f "$OUT/test_cuda_quant.log" ]; then
    echo "test_cuda: $(grep -E '^\[==========\] .* ran' "$OUT/test_cuda_quant.log" | tail -1)"
    grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test' "$OUT/test_cuda_quant.log" | tail -2
    grep -E '^\[  FAILED  \] [A-Za-z]' "$OUT/test_cuda_quant.log" | sort -u | head -20
  fi
  for f in "$OUT"/golden_*.log; do [ -f "$f" ] && echo "golden $(basename "$f" .log): $(tail -1 "$f")"; done
  for f in "$OUT"/route_diff_*.log; do
    [ -f "$f" ] && echo "route-diff $(basename "$f" .log): $(grep -i -m2 'verdict' "$f" | tr '\n' ' ')"
  done
  [ -f "$OUT/moe_lab.md" ] && { echo "moe lab:"; grep -E '^\| [0-9]|^## ' "$OUT/moe_lab.md"; }
  for f in "$OUT"/bench_*.md; do
    [ -f "$f" ] && { echo "$(basename "$f" .md):"; grep -E '^\| (decode|prefill) ' "$f" | head -8; }
  done
  tar -C "$OUT" -czf /tmp/gpu_quant_logs.tgz --exclude=logs.tgz . 2>/dev/null && mv /tmp/gpu_quant_logs.tgz "$OUT/logs.tgz"
  echo "all logs: $OUT/logs.tgz"
}
trap 'summary; exit $rc' EXIT
trap 'rc=124; exit 124' TERM INT

if [ -x "$B/test_cuda" ]; then
  step "test_cuda FP8 linears + linear + quantized MoE experts + MoE"
  timeout 400 "$B/test_cuda" --gtest_filter='*QuantLinear*:CudaOps.Linear*:CudaMoeQuant.*:CudaMoe.*' \
    > "$OUT/test_cuda_quant.log" 2>&1
  r=$?; echo "test_cuda (quant linear + linear + moe quant + moe) rc=$r"
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]|^\[       OK \] CudaMoeQuant" "$OUT/test_cuda_quant.log" | tail -16
  echo "worst rel errs:"; grep -E "rel err" "$OUT/test_cuda_quant.log" | sort -k5 -g -t' ' | tail -4
  [ $r -eq 0 ] || rc=1
fi

step "bench --moe-lab"
timeout 400 "$B/tokenspeed" bench --moe-lab > "$OUT/moe_lab.md" 2> "$OUT/moe_lab.err"
r=$?; echo "moe lab rc=$r"; cat "$OUT/moe_lab.md"; [ $r -eq 0 ] || { tail -5 "$OUT/moe_lab.err"; rc=1; }

step "verify-golden --device cuda"
for m in qwen3_moe_fp8 qwen3_moe_nvfp4 deepseek_v3_fp8 llama3_fp8 llama3_fp8ch qwen3_fp8ch llama3_nvfp4 qwen3_moe deepseek_v3; do
  if [ ! -d tests/data/$m ]; then echo "tests/data/$m missing: skipped"; continue; fi
  timeout 120 "$B/tokenspeed" verify-golden tests/data/$m --device cuda --atol 0.1 > "$OUT/golden_$m.log" 2>&1
  r=$?
  echo "verify-golden $m --device cuda: rc=$r"; tail -6 "$OUT/golden_$m.log"
  case $m in qwen3_moe|deepseek_v3) ;; *) [ $r -eq 0 ] || rc=1 ;; esac  # the bf16 twins: for comparison
done

step "route-diff --device cuda (quantized MoE fixtures)"
for m in qwen3_moe_fp8 qwen3_moe_nvfp4 deepseek_v3_fp8 qwen3_moe; do
  [ -d tests/data/$m ] || continue
  timeout 180 "$B/tokenspeed" route-diff tests/data/$m --device cuda > "$OUT/route_diff_$m.log" 2>&1
  echo "route-diff $m rc=$?"; head -14 "$OUT/route_diff_$m.log"; echo "..."; tail -6 "$OUT/route_diff_$m.log"
done


step "bench --linear-lab"
timeout 300 "$B/tokenspeed" bench --linear-lab > "$OUT/linear_lab.md" 2> "$OUT/linear_lab.err"
r=$?; echo "linear lab rc=$r"; cat "$OUT/linear_lab.md"; [ $r -eq 0 ] || { tail -5 "$OUT/linear_lab.err"; rc=1; }

step "random quantized models load and decode"
for q in fp8 fp8-channel nvfp4 modelopt-mixed; do
  d=/tmp/ts_quant_$q
  timeout 120 "$B/tokenspeed" make-random-model --preset qwen3-30b-a3b --quant $q --num-layers 2 --num-experts 8 \
    --out $d > "$OUT/make_$q.log" 2>&1 || { echo "make-random-model --quant $q failed"; rc=1; continue; }
  timeout 120 "$B/tokenspeed" generate --model $d --device cuda --prompt-ids 1,2,3 --max-tokens 8 --ignore-eos --print-ids \
    > "$OUT/generate_$q.log" 2>&1
  r=$?
  echo "generate $q (cuda): rc=$r"; tail -2 "$OUT/generate_$q.log"
  [ $r -eq 0 ] || rc=1
done
if [ "${SKIP_8B:-0}" != 1 ]; then
  layers=(--num-layers 8); [ "${FULL_8B:-0}" = 1 ] && layers=()
  step "Llama-3.1-8B shapes ${layers[*]}: decode FP8 block-128 vs bf16 vs NVFP4"
  for q in fp8 bf16 nvfp4; do
    d=/tmp/ts_8b_$q
    args=("${layers[@]}"); [ $q = bf16 ] || args+=(--quant $q)
    [ -f $d/config.json ] || timeout 400 "$B/tokenspeed" make-random-model --preset llama-3.1-8b "${args[@]}" --out $d \
      > "$OUT/make_8b_$q.log" 2>&1 || { echo "make-random-model 8b $q failed"; tail -3 "$OUT/make_8b_$q.log"; rc=1; continue; }
    du -sh $d
    timeout 400 "$B/tokenspeed" bench --model $d --device cuda --prompt-lens 512 --batches 1,8,32,64 --contexts 1024 \
      --decode-steps 16 --json "$OUT/bench_8b_$q.json" > "$OUT/bench_8b_$q.md" 2> "$OUT/bench_8b_$q.err"
    r=$?; echo "bench 8b $q rc=$r"; cat "$OUT/bench_8b_$q.md"; [ $r -eq 0 ] || { tail -5 "$OUT/bench_8b_$q.err"; rc=1; }
  done
  rm -rf /tmp/ts_8b_fp8 /tmp/ts_8b_bf16 /tmp/ts_8b_nvfp4
fi

if [ "${SKIP_MOE_E2E:-0}" != 1 ]; then
  step "Qwen3-30B-A3B shapes (4 layers): decode FP8 block-128 vs bf16 experts"
  for q in fp8 bf16; do
    d=/tmp/ts_a3b_$q
    args=(--num-layers 4); [ $q = bf16 ] || args+=(--quant $q)
    timeout 400 "$B/tokenspeed" make-random-model --preset qwen3-30b-a3b "${args[@]}" --out $d \
      > "$OUT/make_a3b_$q.log" 2>&1 || { echo "make-random-model a3b $q failed"; tail -3 "$OUT/make_a3b_$q.log"; rc=1; continue; }
    du -sh $d
    timeout 400 "$B/tokenspeed" bench --model $d --device cuda --prompt-lens 512 --batches 1,8,64 --contexts 1024 \
      --decode-steps 16 --json "$OUT/bench_a3b_$q.json" > "$OUT/bench_a3b_$q.md" 2> "$OUT/bench_a3b_$q.err"
    r=$?; echo "bench a3b $q rc=$r"; cat "$OUT/bench_a3b_$q.md"; [ $r -eq 0 ] || { tail -5 "$OUT/bench_a3b_$q.err"; rc=1; }
  done
  rm -rf /tmp/ts_a3b_fp8 /tmp/ts_a3b_bf16
fi

exit $rc
