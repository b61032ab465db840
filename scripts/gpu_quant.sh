#!/usr/bin/env bash
# Quantized checkpoints on the GPU (issue #16, correctness path): the CUDA backend dequantizes
# FP8 / MXFP8 / NVFP4 weights to bf16 at load, so every quantized fixture must pass
# verify-golden --device cuda with the weight-only tolerance (0.1), and random quantized models of
# each format must load and decode. Usage: scripts/gpu_quant.sh BUILD_DIR (a CUDA build with
# tokenspeed; test_cuda too if present). Logs go to $OUT (default /tmp/out).
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:?usage: scripts/gpu_quant.sh BUILD_DIR}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
rc=0
for m in llama3_fp8 qwen3_moe_fp8 deepseek_v3_fp8 llama3_fp8ch qwen3_fp8ch llama3_nvfp4 qwen3_moe_nvfp4; do
  timeout 120 "$B/tokenspeed" verify-golden tests/data/$m --device cuda --atol 0.1 > "$OUT/golden_$m.log" 2>&1
  r=$?
  echo "verify-golden $m --device cuda: rc=$r"; tail -3 "$OUT/golden_$m.log"
  [ $r -eq 0 ] || rc=1
done
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
if [ -x "$B/test_cuda" ]; then
  timeout 300 "$B/test_cuda" --gtest_filter='*Linear*:*Moe*:*Attention*' > "$OUT/test_cuda_quant.log" 2>&1
  r=$?; echo "test_cuda (linear/moe/attention) rc=$r"; grep -E "PASSED|FAILED" "$OUT/test_cuda_quant.log" | tail -5
  [ $r -eq 0 ] || rc=1
fi
exit $rc
