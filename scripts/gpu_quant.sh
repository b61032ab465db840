#!/usr/bin/env bash
# Quantized checkpoints on the GPU (issue #16). FP8 (block-128, per-channel, per-tensor, MXFP8)
# linear weights stay as stored on CUDA (src/ops/cuda/quant_linear.cu: W8A16 GEMV for decode,
# dequantized bf16 tiles + cuBLASLt for prefill); NVFP4 and the routed experts are still
# dequantized to bf16 at load. In order (most important first):
#  1. test_cuda: the FP8 kernels vs the CPU oracle (and the existing linear tests);
#  2. verify-golden --device cuda on every quantized fixture (weight-only tolerance 0.1);
#  3. tokenspeed bench --linear-lab: FP8 vs bf16 linears at Llama-3.1-8B shapes, GB/s of the
#     stored bytes and % of the copy ceiling measured in the same run;
#  4. decode tok/s of a random Llama-3.1-8B-shaped checkpoint, FP8 block-128 vs bf16, same run;
#  5. random quantized models of each format load and decode.
# Usage: scripts/gpu_quant.sh BIN_DIR (holding tokenspeed and test_cuda). Logs go to $OUT
# (default /tmp/out). SKIP_8B=1 skips step 4 (it writes 2 x 8-16 GB of random checkpoints).
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:?usage: scripts/gpu_quant.sh BIN_DIR}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
rc=0
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

if [ -x "$B/test_cuda" ]; then
  step "test_cuda FP8 linears + linear"
  timeout 300 "$B/test_cuda" --gtest_filter='*QuantLinear*:*Linear*' > "$OUT/test_cuda_quant.log" 2>&1
  r=$?; echo "test_cuda (quant linear + linear) rc=$r"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" "$OUT/test_cuda_quant.log" | tail -8
  grep -E "rel err" "$OUT/test_cuda_quant.log" | sort -k5 -g -t' ' | tail -3
  [ $r -eq 0 ] || rc=1
fi

step "verify-golden --device cuda"
for m in llama3_fp8 qwen3_moe_fp8 deepseek_v3_fp8 llama3_fp8ch qwen3_fp8ch llama3_nvfp4 qwen3_moe_nvfp4; do
  if [ ! -d tests/data/$m ]; then echo "tests/data/$m missing: skipped"; continue; fi
  timeout 120 "$B/tokenspeed" verify-golden tests/data/$m --device cuda --atol 0.1 > "$OUT/golden_$m.log" 2>&1
  r=$?
  echo "verify-golden $m --device cuda: rc=$r"; tail -3 "$OUT/golden_$m.log"
  [ $r -eq 0 ] || rc=1
done

step "bench --linear-lab"
timeout 300 "$B/tokenspeed" bench --linear-lab > "$OUT/linear_lab.md" 2> "$OUT/linear_lab.err"
r=$?; echo "linear lab rc=$r"; cat "$OUT/linear_lab.md"; [ $r -eq 0 ] || { tail -5 "$OUT/linear_lab.err"; rc=1; }

if [ "${SKIP_8B:-0}" != 1 ]; then
  step "Llama-3.1-8B shapes: decode FP8 block-128 vs bf16"
  for q in fp8 bf16; do
    d=/tmp/ts_8b_$q
    args=(); [ $q = bf16 ] || args=(--quant $q)
    [ -f $d/config.json ] || timeout 400 "$B/tokenspeed" make-random-model --preset llama-3.1-8b "${args[@]}" --out $d \
      > "$OUT/make_8b_$q.log" 2>&1 || { echo "make-random-model 8b $q failed"; tail -3 "$OUT/make_8b_$q.log"; rc=1; continue; }
    du -sh $d
    timeout 400 "$B/tokenspeed" bench --model $d --device cuda --prompt-lens 512 --batches 1,8,32,64 --contexts 1024 \
      --decode-steps 32 --json "$OUT/bench_8b_$q.json" > "$OUT/bench_8b_$q.md" 2> "$OUT/bench_8b_$q.err"
    r=$?; echo "bench 8b $q rc=$r"; cat "$OUT/bench_8b_$q.md"; [ $r -eq 0 ] || { tail -5 "$OUT/bench_8b_$q.err"; rc=1; }
  done
  rm -rf /tmp/ts_8b_fp8 /tmp/ts_8b_bf16
fi

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
exit $rc
