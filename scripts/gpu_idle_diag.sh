#!/usr/bin/env bash
# Where the device idles between engine steps: serves a random Llama-3.1-8B-shaped checkpoint in
# several configurations (CONFIGS: mixed = --enable-mixed-batch with the default host KV tier,
# mixed_bs256 = graphs up to bs256, mixed_nokv = --disable-kvstore, plain = no mixed steps), runs
# bench serving at CONC (64,256; 1k-token prompts, 128 new tokens) and prints /metrics' idle
# breakdown (tokenspeed_device_idle_seconds_by_step_total: by the kind of step after the gap and
# its launch; tokenspeed_device_idle_gap_seconds: the gaps' sizes). Logs to $OUT.
set -uo pipefail
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=$PWD/.device/bin
[ -d "$B" ] || tar -C .device -xJf .device/bin.tar.xz
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
M=/tmp/l8b
timeout 200 "$B/tokenspeed" make-random-model --preset llama-3.1-8b --out "$M" > "$OUT/make8b.log" 2>&1; el "make rc=$?"
run() {
  local name=$1; shift
  PORT=30031
  "$B/tokenspeed" serve "$M" --port $PORT --device cuda --max-num-seqs 256 "$@" > "$OUT/serve_$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 240); do curl -sf "http://127.0.0.1:$PORT/health" > /dev/null 2>&1 && break; sleep 0.5; done
  el "$name up"
  timeout 150 "$B/tokenspeed" bench serving --base-url "http://127.0.0.1:$PORT" --concurrency ${CONC:-64,256} \
    --prompt-tokens 1024 --max-tokens 128 --seed 1 > "$OUT/serving_$name.txt" 2> "$OUT/serving_$name.err"
  el "$name bench rc=$?"; cat "$OUT/serving_$name.txt"
  curl -s "http://127.0.0.1:$PORT/metrics" > "$OUT/metrics_$name.txt"
  grep -E "^tokenspeed_(device_idle_seconds|device_busy|engine_steps|engine_overlap|retractions|engine_step_seconds_by|engine_step_host|engine_step_plan|engine_step_apply|kvstore_bytes_written)" "$OUT/metrics_$name.txt"
  kill $pid; wait $pid 2>/dev/null
}
for c in ${CONFIGS:-mixed mixed_bs256 mixed_nokv plain}; do
  case $c in
    mixed) run mixed --enable-mixed-batch ;;
    mixed_bs256) run mixed_bs256 --enable-mixed-batch --cuda-graph-max-bs 256 ;;
    mixed_nokv) run mixed_nokv --enable-mixed-batch --disable-kvstore ;;
    plain) run plain ;;
  esac
done
el done
