#!/usr/bin/env bash
# One GPU-machine command (binaries from scripts/device_bundle.sh in .device/), logs to $OUT:
#  1. bench --gemm-lab at decode row counts (16-256): cuBLASLt's first pick vs the best of its first 8;
#  2. the linear CUDA tests (CudaOps.Linear*: the autotune's test included);
#  3. bench --graphs (random Llama-3.1-8B, decode bs1/bs64 @1k, prefill 1k) without and with
#     --gemm-autotune, same machine, back to back (#17's bs64 figure, #22's rows);
#  4. serve + bench serving at concurrency CONC (64,256; 1k prompts, 128 outputs): out tok/s, ITL and
#     the device idle share between steps (#17: < 2%);
#  5. with the time left (BUDGET s, default 560), every other test_cuda suite.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=$PWD/.device/bin
[ -d "$B" ] || tar -C .device -xJf .device/bin.tar.xz
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
T0=$(date +%s); DL=$((T0 + ${BUDGET:-560}))
left() { echo $(( DL - $(date +%s) )); }
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
M=/tmp/l8b
(timeout 200 "$B/tokenspeed" make-random-model --preset llama-3.1-8b --out $M > "$OUT/make8b.log" 2>&1 && touch $M.done) &
timeout 100 "$B/tokenspeed" bench --gemm-lab --gemm-ms 16,32,64,128,256 > "$OUT/gemm_lab.md" 2> "$OUT/gemm_lab.err"
el "gemm lab rc=$?"; grep -E "^\|" "$OUT/gemm_lab.md"
timeout 90 "$B/test_cuda" --gtest_filter='CudaOps.Linear*' > "$OUT/t_linear.log" 2>&1
el "CudaOps.Linear* rc=$?"; grep -E "^\[  (PASSED|FAILED)|OK \]|Failure|Expected|Which is" "$OUT/t_linear.log" | head -20
wait
[ -f $M.done ] || { el "no 8B checkpoint"; tail -3 "$OUT/make8b.log"; exit 1; }
for a in default autotune; do
  f=; [ $a = autotune ] && f=--gemm-autotune
  timeout 120 "$B/tokenspeed" bench --model $M --device cuda --graphs $f --prompt-lens 1024 --batches 1,64 --contexts 1024 \
    > "$OUT/bench_$a.md" 2> "$OUT/bench_$a.err"
  el "bench --graphs $a rc=$?"; grep -E "^\|" "$OUT/bench_$a.md" | head -12
done
if [ "$(left)" -gt 150 ]; then
  PORT=30031
  "$B/tokenspeed" serve $M --port $PORT --device cuda --max-num-seqs 256 --enable-mixed-batch > "$OUT/serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 240); do curl -sf "http://127.0.0.1:$PORT/health" > /dev/null 2>&1 && break; sleep 0.5; done
  timeout $(( $(left) - 40 )) "$B/tokenspeed" bench serving --base-url "http://127.0.0.1:$PORT" --concurrency "${CONC:-64,256}" \
    --prompt-tokens 1024 --max-tokens 128 --seed 1 > "$OUT/serving.txt" 2> "$OUT/serving.err"
  el "bench serving rc=$?"; cat "$OUT/serving.txt"
  curl -s "http://127.0.0.1:$PORT/metrics" | grep -E "^tokenspeed_device_(idle|busy)" | head -6
  kill $pid; wait $pid 2>/dev/null
fi
for s in $("$B/test_cuda" --gtest_list_tests | grep -v '^ ' | grep '\.$'); do
  [ "$(left)" -lt 25 ] && { el "test_cuda stopped (time) at $s"; break; }
  timeout $(( $(left) - 10 )) "$B/test_cuda" --gtest_filter="${s}*" > "$OUT/t.log" 2>&1; rc=$?
  echo "$s rc=$rc ok=$(grep -c '^\[       OK' "$OUT/t.log") skip=$(grep -c '^\[  SKIPPED' "$OUT/t.log")"
  [ $rc -ne 0 ] && grep -E "FAILED|Failure|Expected|Which is" "$OUT/t.log" | head -8
done
el done
