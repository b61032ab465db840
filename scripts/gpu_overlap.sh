#!/usr/bin/env bash
# On the GPU machine: overlap scheduling and mixed batches on the Llama-3.1-8B shapes (random
# weights). Serves with each configuration and runs `bench serving` (1k-token prompts, 128
# output tokens) at concurrency 16/64/256: req/s, out tok/s, TTFT and ITL p50/p99 and the
# device idle share between steps (dev_idle%, from /metrics). Then the overlap unit tests.
# Usage: scripts/gpu_overlap.sh [BUILD_DIR]   (default build; BIN_DIR overrides the binary's dir)
# Env: CONC (16,64,256), PROMPT (1024), GEN (128), MIXED ("256 512 1024": --mixed-prefill-tokens
# values to sweep), MODEL (/tmp/l8b: made once with make-random-model).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN=${BIN_DIR:-$BUILD}/tokenspeed
MODEL=${MODEL:-/tmp/l8b}
PORT=${PORT:-30013}
CONC=${CONC:-16,64,256}
[ -f "$MODEL/config.json" ] || "$BIN" make-random-model --preset llama-3.1-8b --out "$MODEL" || exit 1
wait_ready() {
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null 2>&1 && return 0
    sleep 0.5
  done
  return 1
}
run_case() {  # name, serve flags...
  local name=$1; shift
  echo "== $name: serve $*"
  "$BIN" serve "$MODEL" --port $PORT --device cuda --max-num-seqs 256 "$@" > /tmp/serve_overlap_$name.log 2>&1 &
  local pid=$!
  if ! wait_ready; then echo "server $name did not start"; tail -5 /tmp/serve_overlap_$name.log; kill $pid; return; fi
  timeout 900 "$BIN" bench serving --base-url http://127.0.0.1:$PORT --concurrency "$CONC" \
    --prompt-tokens "${PROMPT:-1024}" --max-tokens "${GEN:-128}" --seed 1
  curl -s "http://127.0.0.1:$PORT/metrics" | grep -E "device_|overlap_steps|step_host|retractions" | grep -v '^#'
  kill $pid; wait $pid 2>/dev/null
}
run_case overlap
run_case simple --disable-overlap-schedule
for m in ${MIXED:-256 512 1024}; do run_case "mixed$m" --enable-mixed-batch --mixed-prefill-tokens "$m"; done
run_case mixed512_simple --enable-mixed-batch --mixed-prefill-tokens 512 --disable-overlap-schedule
# The CPU-backed overlap and scheduler tests (seconds), and the CUDA tests of the runtime.
[ -x "$BUILD/test_runtime" ] && "$BUILD/test_runtime" --gtest_filter='Overlap.*:Scheduler.*'
[ -x "$BUILD/test_cuda" ] && "$BUILD/test_cuda" --gtest_filter='*Engine*:*Graph*'
exit 0
