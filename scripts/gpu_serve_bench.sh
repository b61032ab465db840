#!/usr/bin/env bash
# On the GPU machine (prebuilt binaries in .device): serve the demo pair on CUDA and run the
# agentic benchmark at concurrency 1/8/32 without and with EAGLE3, plus /metrics snapshots.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=.device/bin
[ -d $B ] || tar -C .device -xJf .device/bin.tar.xz
OUT=${OUT:-/tmp/out}
PORT=30011
wait_ready() {
  for _ in $(seq 120); do
    python3 -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$PORT/health').status==200 else 1)" 2>/dev/null && return 0
    sleep 0.5
  done
  return 1
}
run_case() {  # name, serve flags...
  local name=$1; shift
  $B/tokenspeed serve --port $PORT --device ${DEVICE:-cuda} "$@" > /tmp/serve_$name.log 2>&1 &
  local pid=$!
  wait_ready || { echo "server $name did not start"; tail -5 /tmp/serve_$name.log; kill $pid; return; }
  timeout 200 $B/tokenspeed bench agentic --base-url http://127.0.0.1:$PORT --out $OUT/$name --concurrency ${CONC:-1,8,32} \
    --turns 2 --first-turn-tokens ${FIRST:-1500} --turn-tokens 200 --max-tokens 128 --warmup 1 --ignore-eos \
    --tokenizer models/pycoder --no-progress 2>&1 | tail -6
  python3 -c "import urllib.request; print('\n'.join(l for l in urllib.request.urlopen('http://127.0.0.1:$PORT/metrics').read().decode().splitlines() if 'step' in l or 'spec' in l or 'hit' in l))"
  kill $pid; wait $pid 2>/dev/null
}
echo "== demo model, no speculation"; run_case plain
echo "== demo pair, EAGLE3 (3 draft steps)"; run_case eagle3 --speculative-algorithm EAGLE3 \
  --speculative-draft-model-path models/pycoder-eagle3 --speculative-num-steps 3
