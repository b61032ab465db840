#!/usr/bin/env bash
# One GPU-machine command for the engine-level figures of #17 and #18 (binaries from
# scripts/device_bundle.sh in .device/), on a random Llama-3.1-8B-shaped checkpoint; logs to $OUT:
#  1. bench --graphs: decode bs1 / bs64 @1k through the engine's CUDA graphs, copy ceiling in the
#     same run (#17: bs64 >= 1.1 x 8,401 tok/s on the H200);
#  2. serve (overlap scheduling, graphs, SERVE_FLAGS: default --enable-mixed-batch, #17 item 5's
#     ITL p99 <= 2.5 x p50) and bench serving at concurrency CONC (16,64,256), 1k-token prompts,
#     128 new tokens: TTFT and ITL p50/p99 and the device idle share between steps (dev_idle%,
#     CUDA events; #17: < 2% at 64/256); the grammar step's plain runs give it without mixed steps;
#  3. scripts/gpu_grammar_cost.sh at concurrency 64 (#18: <= 3%).
# Usage: scripts/gpu_engine_session.sh [STEPS] (a comma list of bench,serving,grammar; default all).
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=$PWD/.device/bin
[ -d "$B" ] || tar -C .device -xJf .device/bin.tar.xz
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
STEPS=${1:-bench,serving,grammar}
has() { [[ ",$STEPS," == *",$1,"* ]]; }
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
M=${MODEL_DIR:-/tmp/l8b}
[ -f "$M/config.json" ] || { timeout 200 "$B/tokenspeed" make-random-model --preset llama-3.1-8b --out "$M" > "$OUT/make8b.log" 2>&1; el "make-random-model rc=$?"; }
if has bench; then
  timeout 150 "$B/tokenspeed" bench --model "$M" --device cuda --graphs --prompt-lens 1024 --batches 1,64 --contexts 1024 \
    > "$OUT/bench8b.md" 2> "$OUT/bench8b.err"
  el "bench --graphs rc=$?"; grep -E '^\|' "$OUT/bench8b.md" | head -16; tail -2 "$OUT/bench8b.err"
fi
if has serving; then
  PORT=30031
  "$B/tokenspeed" serve "$M" --port $PORT --device cuda --max-num-seqs 256 ${SERVE_FLAGS---enable-mixed-batch} \
    > "$OUT/serve_engine.log" 2>&1 &
  pid=$!
  for _ in $(seq 240); do curl -sf "http://127.0.0.1:$PORT/health" > /dev/null 2>&1 && break; sleep 0.5; done
  timeout 240 "$B/tokenspeed" bench serving --base-url "http://127.0.0.1:$PORT" --concurrency "${CONC:-16,64,256}" \
    --prompt-tokens 1024 --max-tokens 128 --seed 1 > "$OUT/serving.txt" 2> "$OUT/serving.err"
  el "bench serving rc=$?"; cat "$OUT/serving.txt"; tail -2 "$OUT/serving.err"
  curl -s "http://127.0.0.1:$PORT/metrics" | grep -E "^tokenspeed_device_(idle|busy)|overlap_steps|retractions" | head
  kill $pid; wait $pid 2>/dev/null
fi
if has grammar; then
  MODEL_DIR=$M OUT=$OUT timeout "${GRAMMAR_TIMEOUT:-330}" scripts/gpu_grammar_cost.sh "$B" > "$OUT/grammar_cost.txt" 2>&1
  el "grammar cost rc=$?"; grep -vE "^\s*$" "$OUT/grammar_cost.txt" | tail -45
fi
tar -C "$OUT" -czf /tmp/engine_logs.tgz --exclude=logs.tgz . 2>/dev/null && mv /tmp/engine_logs.tgz "$OUT/logs.tgz"
el done
