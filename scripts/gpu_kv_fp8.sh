#!/usr/bin/env bash
# The FP8 (e4m3) KV cache on the GPU (#16 item 4), binaries prebuilt (CUDA ON) in BIN_DIR:
#  1. test_cuda: the FP8 cache writers (bytes equal the CPU's), every attention path over FP8
#     caches with scales, the MLA latent in FP8, whole models with FP8 vs bf16 caches;
#  2. verify-golden --device cuda --kv-cache-dtype fp8 on the dense fixtures (atol 0.3, the CPU
#     fp8 goldens' bound) and, informational, DeepSeek-V3's FP8 latent (routing flips);
#  3. generate on the demo model with bf16 vs FP8 caches (texts compared), EAGLE3 bench-spec over
#     both (acceptance);
#  4. bench --attention-lab (FP8-cache row next to bf16, GB/s vs the copy ceiling) and 8B decode
#     (random FP8 weights) with bf16 vs FP8 caches at batch 1/64 x context 1k/8k, CUDA graphs.
# Usage: scripts/gpu_kv_fp8.sh [BIN_DIR] (default build); logs in ${OUT:-/tmp/out}, summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
OUT=${OUT:-/tmp/out}
M8=${MODEL:-/tmp/l8f}
mkdir -p "$OUT"
S=$OUT/summary.txt
: > "$S"
say() { echo "$*" | tee -a "$S"; }
mk=
if [ ! -f "$M8/config.json" ]; then  # written while the tests run
  timeout 240 "$B/tokenspeed" make-random-model --preset llama-3.1-8b --quant fp8 --out "$M8" > "$OUT/mk.log" 2>&1 &
  mk=$!
fi
F='CudaAttention.Fp8Cache:CudaOps.KvWrite*:CudaOps.FusedRopeKvWrite*:CudaMla.Fp8LatentCache:CudaKvFp8Model.*'
timeout 240 "$B/test_cuda" --gtest_filter="$F" > "$OUT/test_kv_fp8.log" 2>&1
say "test_cuda FP8 KV: rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED|fp8 vs bf16 KV" "$OUT/test_kv_fp8.log" | tee -a "$S"
for f in llama3 llama2_mha qwen3 deepseek_v3; do
  timeout 120 "$B/tokenspeed" verify-golden tests/data/$f --device cuda --kv-cache-dtype fp8 --atol 0.3 > "$OUT/golden_$f.log" 2>&1
  say "verify-golden fp8 $f: rc=$? $(tail -1 "$OUT/golden_$f.log")"
done
for kv in auto fp8; do
  timeout 120 "$B/tokenspeed" generate --device cuda --kv-cache-dtype $kv --max-tokens 48 --prompt "def fibonacci(n):" > "$OUT/gen_$kv.txt" 2>/dev/null
  timeout 300 "$B/tokenspeed" bench-spec --device cuda --batches 1,8 --gen-tokens 128 --kv-cache-dtype $kv \
    --prompts-json models/pycoder-eagle3/spec_golden.json --speculative-algorithm EAGLE3 --speculative-num-steps 3 \
    --speculative-draft-model-path models/pycoder-eagle3 --max-total-tokens 200000 > "$OUT/spec_$kv.log" 2>&1
  say "bench-spec kv=$kv:"; grep -E "^(plain|eagle3) " "$OUT/spec_$kv.log" | tee -a "$S"
done
cmp -s "$OUT/gen_auto.txt" "$OUT/gen_fp8.txt" && say "generate: FP8-cache text == bf16-cache text" || say "generate: texts differ"
timeout 300 "$B/tokenspeed" bench --attention-lab --device cuda > "$OUT/attention_lab.md" 2> "$OUT/attention_lab.err"
say "attention lab: rc=$?"; grep -E "FP8|default \(" "$OUT/attention_lab.md" | tee -a "$S"
[ -n "$mk" ] && wait "$mk"
for kv in auto fp8; do
  timeout 300 "$B/tokenspeed" bench --model "$M8" --device cuda --kv-cache-dtype $kv --batches 1,64 --contexts 1024,8192 \
    --prompt-lens 8192 --graphs > "$OUT/bench8f_$kv.log" 2>&1
  say "bench 8B FP8 weights, kv=$kv: rc=$?"; grep -E "^\| (prefill|decode)|memory bandwidth" "$OUT/bench8f_$kv.log" | tee -a "$S"
done
