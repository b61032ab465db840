#!/usr/bin/env bash
# The CUDA work not yet run on a GPU, in one command, binaries prebuilt (CUDA ON) in BIN_DIR:
#  1. every test_cuda suite in its own process (an abort loses one suite), the suites never run
#     on a GPU first: DeterministicOps / DeterministicEngine (batch-invariant mode, incl. a
#     16,400-row chunk past grid.y's limit), CudaAttention (sliding windows, FP8 caches),
#     CudaKvFp8Model, CudaMla (FP8 latent), then the rest;
#  2. verify-golden on CUDA with an FP8 (e4m3) KV cache (atol 0.3, the CPU fp8 goldens' bound);
#     the demo model's text with bf16 vs FP8 caches;
#  3. unless NO_BENCH=1: Llama-3.1-8B shapes (random weights, CUDA graphs) with and without
#     --deterministic (the mode's cost), then bf16 vs FP8 KV at batch 64 x 8k context.
# Usage: scripts/gpu_unrun.sh [BIN_DIR] (default build). Logs in ${OUT:-/tmp/out}; BUDGET seconds
# (default 540) bounds the whole run: later steps are skipped, saying so, when it runs out.
set -u
cd "$(dirname "$0")/.."
B=${1:-build}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
T0=$(date +%s); DL=$((T0 + ${BUDGET:-540}))
left() { echo $(( DL - $(date +%s) )); }
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
cap() { local l=$(( $(left) - ${2:-10} )); echo $(( l < $1 ? l : $1 )); }  # min(limit, time left - margin)
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
M8=${MODEL:-/tmp/l8b}
if [ "${NO_BENCH:-0}" != 1 ] && [ ! -f "$M8.done" ]; then  # written while the tests run
  (rm -rf "$M8"; timeout 300 "$B/tokenspeed" make-random-model --preset llama-3.1-8b --out "$M8" > "$OUT/mk8b.log" 2>&1 &&
     touch "$M8.done") &
fi
PRIO="DeterministicOps. CudaAttention. DeterministicEngine. CudaKvFp8Model. CudaMla. CudaOps. CudaGraphs."
ALL=$("$B/test_cuda" --gtest_list_tests | grep -v '^ ' | grep '\.$')
for s in $PRIO $(for x in $ALL; do [[ " $PRIO " == *" $x "* ]] || echo "$x"; done); do
  [ "$(left)" -lt "${TEST_RESERVE:-250}" ] && { el "tests stopped here (time): $s and later suites not run"; break; }
  timeout 120 "$B/test_cuda" --gtest_filter="${s}*" > "$OUT/t_${s%.}.log" 2>&1; rc=$?
  el "$s rc=$rc ok=$(grep -c '^\[       OK' "$OUT/t_${s%.}.log") skipped=$(grep -c '^\[  SKIPPED \]' "$OUT/t_${s%.}.log")" \
     "$(grep -E '^\[==========\] .*ran' "$OUT/t_${s%.}.log" | grep -oE '\([0-9]+ ms total\)')"
  [ $rc -ne 0 ] && grep -E "FAILED|Failure|what\(\)|Abort|Expected|Which is|actual|rror" "$OUT/t_${s%.}.log" | head -16
done
for m in llama3 qwen3 deepseek_v3; do
  [ -d tests/data/$m ] || { el "golden fp8kv $m: no tests/data/$m here"; continue; }
  timeout 40 "$B/tokenspeed" verify-golden tests/data/$m --device cuda --kv-cache-dtype fp8 --atol 0.3 > "$OUT/gf_$m.log" 2>&1
  r=$?
  # DeepSeek-V3's e4m3 latent flips its random router's expert choices (CPU: 1.56; tests.cmake keeps
  # it out of the FP8-KV goldens): reported, not a failure.
  note=; [ $m = deepseek_v3 ] && [ $r -ne 0 ] && note=" (expected: routing flips, as on the CPU)"
  el "golden fp8kv $m rc=$r $(tail -1 "$OUT/gf_$m.log")$note"
done
gen_ok=1
for kv in auto fp8; do
  timeout 40 "$B/tokenspeed" generate --device cuda --kv-cache-dtype $kv --max-tokens 48 --prompt "def fibonacci(n):" \
    > "$OUT/gen_$kv.txt" 2> "$OUT/gen_$kv.err"
  rc=$?; el "generate kv=$kv rc=$rc"
  [ $rc -eq 0 ] && [ -s "$OUT/gen_$kv.txt" ] || { gen_ok=0; tail -3 "$OUT/gen_$kv.err"; }
done
if [ $gen_ok = 0 ]; then el "generate: a run failed (texts not compared)"
elif cmp -s "$OUT/gen_auto.txt" "$OUT/gen_fp8.txt"; then el "generate: FP8-cache text == bf16-cache text"
else el "generate: texts differ"; head -c 300 "$OUT/gen_auto.txt"; echo; head -c 300 "$OUT/gen_fp8.txt"; echo; fi
[ "${NO_BENCH:-0}" = 1 ] && { el "done (NO_BENCH)"; exit 0; }
wait
[ -f "$M8.done" ] || { el "no 8B checkpoint (make-random-model failed: $OUT/mk8b.log)"; exit 1; }
for mode in default deterministic; do
  [ "$(left)" -lt 70 ] && { el "bench $mode skipped (time)"; continue; }
  flag=; [ $mode = deterministic ] && flag=--deterministic
  timeout "$(cap 100)" "$B/tokenspeed" bench --model "$M8" --device cuda --graphs $flag --prompt-lens 8192 --batches 1,64 \
    --contexts 1024 > "$OUT/det_$mode.log" 2>&1
  el "bench bf16 $mode rc=$?"; grep -E "^\| (prefill|decode)|bandwidth|ceiling" "$OUT/det_$mode.log" | head -10
done
for kv in auto fp8; do
  [ "$(left)" -lt 60 ] && { el "bench kv=$kv skipped (time)"; continue; }
  timeout "$(cap 90 5)" "$B/tokenspeed" bench --model "$M8" --device cuda --graphs --kv-cache-dtype $kv --prompt-lens 1024 \
    --batches 64 --contexts 8192 > "$OUT/kv_$kv.log" 2>&1
  el "bench 8B kv=$kv rc=$?"; grep -E "^\| (prefill|decode)|bandwidth|ceiling" "$OUT/kv_$kv.log" | head -8
done
el "done"
