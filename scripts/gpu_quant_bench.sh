#!/usr/bin/env bash
# The figures issue #16 asks for, in one command on the GPU machine (binaries prebuilt, CUDA ON):
#  0. the quantized kernels' CUDA tests and verify-golden --device cuda on the quantized fixtures
#     present in tests/data (weight-only tolerance 0.1);
#  1. bench --linear-lab and --moe-lab (kernel labs: GB/s of the stored bytes vs the copy ceiling),
#     alone on the machine (random checkpoints written beside them disturbed their timings);
#  2. random Llama-3.1-8B-shaped checkpoints, bf16 / FP8 block-128 / NVFP4 (ModelOpt), and
#     Qwen3-30B-A3B-shaped ones (A3B_LAYERS of 48 layers, all 128 experts) bf16 / FP8 / NVFP4;
#  3. bench --graphs (as serve runs) per format: prefill 8k (FP8 vs bf16 prefill ratio), decode bs1,
#     bs16 and bs64 @1k; FP8 also with an FP8 KV cache; ceilings in each run;
#  4. the A3B shapes: decode bs1, bs8 and bs64 @1k, % of copy over the experts actually read
#     (bench's bytes per step).
set -u
cd "$(dirname "$0")/.."
B=${1:-build}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
T0=$(date +%s); DL=$((T0 + ${BUDGET:-560}))
left() { echo $(( DL - $(date +%s) )); }
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
cap() { local l=$(( $(left) - ${2:-10} )); echo $(( l < $1 ? l : $1 )); }
rows() { grep -E "^\| (prefill|decode|memory|GEMM|bf16|fp8|nvfp4|[0-9])|^quantized|^## " "$1" | head -${2:-14}; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
D=${MODELS:-/tmp/qb}
mkdir -p "$D"
if [ -x "$B/test_cuda" ] && [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "$(cap 150)" "$B/test_cuda" --gtest_filter='CudaMoeQuant.*:CudaOps.QuantLinear*:CudaMoe.*:CudaQuantModel.*:CudaW8A8Model.*:CudaFp8Gemm.*' \
    > "$OUT/test_quant.log" 2>&1
  el "test_cuda quant rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/test_quant.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \] [A-Z]|Failure|Expected|Which is|max abs|what\(\)" "$OUT/test_quant.log" | head -20
  for m in qwen3_moe_fp8 qwen3_moe_nvfp4 deepseek_v3_fp8 llama3_fp8 llama3_fp8ch qwen3_fp8ch llama3_nvfp4; do
    [ -d tests/data/$m ] || continue
    timeout 60 "$B/tokenspeed" verify-golden tests/data/$m --device cuda --atol 0.1 > "$OUT/golden_$m.log" 2>&1
    el "verify-golden $m cuda rc=$? $(tail -1 "$OUT/golden_$m.log")"
  done
fi
for lab in ${LABS-linear moe}; do
  timeout "$(cap 150)" "$B/tokenspeed" bench --$lab-lab > "$OUT/${lab}_lab.md" 2> "$OUT/${lab}_lab.err"
  el "$lab lab rc=$?"; grep -E '^\||^## ' "$OUT/${lab}_lab.md" | head -40
done
mk() {  # name preset quant extra...
  local n=$1 p=$2 q=$3; shift 3
  local args=("$@"); [ "$q" = bf16 ] || args+=(--quant "$q")
  (s=$(date +%s); timeout 300 "$B/tokenspeed" make-random-model --preset "$p" "${args[@]}" --out "$D/$n" \
     > "$OUT/mk_$n.log" 2>&1 && touch "$D/$n.done"; echo "make $n: $(( $(date +%s) - s )) s" >> "$OUT/mk_times.log") &
}
for q in ${FORMATS_8B-bf16 fp8 nvfp4}; do mk 8b_$q llama-3.1-8b $q; done
wait
for q in ${FORMATS_8B-bf16 fp8 nvfp4}; do
  [ -f "$D/8b_$q.done" ] || { el "8b $q: make-random-model failed: $(tail -2 "$OUT/mk_8b_$q.log")"; continue; }
  [ "$(left)" -lt 60 ] && { el "bench 8b $q skipped (time)"; continue; }
  timeout "$(cap 110)" "$B/tokenspeed" bench --model "$D/8b_$q" --device cuda --graphs --prompt-lens 8192 --batches 1,16,64 \
    --contexts 1024 --json "$OUT/b8_$q.json" > "$OUT/b8_$q.md" 2> "$OUT/b8_$q.err"
  el "bench 8b $q rc=$?"; rows "$OUT/b8_$q.md"; tail -2 "$OUT/b8_$q.err"
  if [ $q = fp8 ] && [ "$(left)" -gt 60 ]; then
    timeout "$(cap 80)" "$B/tokenspeed" bench --model "$D/8b_$q" --device cuda --graphs --kv-cache-dtype fp8 \
      --prompt-lens 1024 --batches 1,64 --contexts 1024 > "$OUT/b8_fp8_kvfp8.md" 2> "$OUT/b8_fp8_kvfp8.err"
    el "bench 8b fp8 + fp8 KV rc=$?"; rows "$OUT/b8_fp8_kvfp8.md"
  fi
  rm -rf "$D/8b_$q"
done
for q in ${FORMATS_A3B-bf16 fp8 nvfp4}; do mk a3b_$q qwen3-30b-a3b $q --num-layers "${A3B_LAYERS:-12}"; done
wait
cat "$OUT/mk_times.log"
for q in ${FORMATS_A3B-bf16 fp8 nvfp4}; do
  [ -f "$D/a3b_$q.done" ] || { el "a3b $q: make-random-model failed: $(tail -2 "$OUT/mk_a3b_$q.log")"; continue; }
  [ "$(left)" -lt 50 ] && { el "bench a3b $q skipped (time)"; continue; }
  timeout "$(cap 90)" "$B/tokenspeed" bench --model "$D/a3b_$q" --device cuda --graphs --prompt-lens 1024 --batches "${A3B_BATCHES:-1,8,64}" \
    --contexts 1024 > "$OUT/a3b_$q.md" 2> "$OUT/a3b_$q.err"
  el "bench a3b $q rc=$?"; rows "$OUT/a3b_$q.md"; tail -2 "$OUT/a3b_$q.err"
  rm -rf "$D/a3b_$q"
done
# Only a few files come back from the GPU machine: every log in one archive.
tar -C "$OUT" -czf /tmp/quant_bench_logs.tgz --exclude=logs.tgz . 2>/dev/null && mv /tmp/quant_bench_logs.tgz "$OUT/logs.tgz"
el "done (logs: $OUT/logs.tgz)"
