#!/usr/bin/env bash
# The host KV tier (KvStore) on the GPU machine, with prebuilt binaries in .device (or B=build dir):
#  1. tests/cuda/kv_store_test.cpp: copy-stream round trip (MHA + MLA pools) and the load GB/s of a
#     32k-token prefix of Llama-3.1-8B shapes from pinned host memory (target >= 20 GB/s);
#  2. the engine tests of the tier on the CPU backend (same code path) as a sanity check;
#  3. `bench agentic` on a random-weight Llama-3.1-8B (real shapes) at 8k and 32k tokens per
#     conversation, with more conversations than the device pool holds, with and without the tier:
#     later-turn TTFT, per-tier hit rates, GB loaded from the host (target: later-turn TTFT with the
#     tier <= 0.3x without).
# Usage: scripts/gpu_kvstore.sh            (OUT=/tmp/out, CTX="8192 32768", CONVS=4)
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=${B:-.device/bin}
[ -d "$B" ] || tar -C .device -xJf .device/bin.tar.xz
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
PORT=30013

echo "== 1. KvStore on CUDA (copy stream, 32k-token 8B-shape load bandwidth)"
timeout 300 "$B"/test_cuda --gtest_filter='KvStoreCuda*' > "$OUT/kvstore_cuda.log" 2>&1; echo "test_cuda KvStoreCuda rc=$?"
grep -E "kvstore load|OK \]|FAILED|SKIPPED" "$OUT/kvstore_cuda.log"

echo "== 2. the tier's engine tests (CPU backend)"
if [ -x "$B"/test_runtime ]; then
  timeout 600 "$B"/test_runtime --gtest_filter='KvStore*' > "$OUT/kvstore_runtime.log" 2>&1; echo "test_runtime KvStore* rc=$?"
  grep -E "^\[  (PASSED|FAILED) |FAILED|later-turn" "$OUT/kvstore_runtime.log" | head
fi

echo "== 3. bench agentic, random Llama-3.1-8B, with / without the host tier"
[ -f /tmp/l8b/config.json ] || { timeout 300 "$B"/tokenspeed make-random-model --preset llama-3.1-8b --out /tmp/l8b > "$OUT/make8b.log" 2>&1; echo "make-random-model rc=$?"; }
wait_ready() {
  for _ in $(seq 600); do
    curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health" 2>/dev/null | grep -q 200 && return 0
    sleep 0.5
  done
  return 1
}
metric() { curl -s "http://127.0.0.1:$PORT/metrics" | grep -E "^$1[{ ]" | awk '{s+=$NF} END {print s+0}'; }
CONVS=${CONVS:-4}
for ctx in ${CTX:-8192 32768}; do
  # A device pool that holds about half the conversations (each grows to ~ctx + 3 x 256 tokens).
  pool=$(( (ctx + 1024) * CONVS / 2 ))
  for tier in on off; do
    flags=(--max-total-tokens $pool --context-length $(( ctx + 4096 )) --kvstore-size ${KVSTORE_GB:-48})
    [ $tier = off ] && flags+=(--disable-kvstore)
    name=ctx${ctx}_tier_$tier
    "$B"/tokenspeed serve /tmp/l8b --port $PORT --device cuda "${flags[@]}" > "$OUT/serve_$name.log" 2>&1 &
    pid=$!
    if ! wait_ready; then echo "server $name did not start"; tail -5 "$OUT/serve_$name.log"; kill $pid; continue; fi
    grep -E "kvstore:|KV pool" "$OUT/serve_$name.log" | sed 's/^.*\] //'
    timeout 900 "$B"/tokenspeed bench agentic --base-url http://127.0.0.1:$PORT --out "$OUT/$name" \
      --concurrency $CONVS --conversations $CONVS --turns 4 --first-turn-tokens $ctx --turn-tokens 256 \
      --max-tokens 32 --warmup 0 --ignore-eos --no-progress 2>&1 | tail -8
    echo "$name: loaded_bytes=$(metric tokenspeed_kvstore_loaded_bytes_total) load_s=$(metric tokenspeed_kvstore_load_seconds_total)" \
         "host_hit_tokens=$(metric tokenspeed_prefix_cache_host_hit_tokens_total) device_hit_tokens=$(metric tokenspeed_prefix_cache_device_hit_tokens_total)"
    kill $pid; wait $pid 2>/dev/null
  done
  python3 - "$OUT" "$ctx" <<'PY'
import json, sys
out, ctx = sys.argv[1], sys.argv[2]
try:
    on = json.load(open(f"{out}/ctx{ctx}_tier_on/results.json"))["levels"][0]
    off = json.load(open(f"{out}/ctx{ctx}_tier_off/results.json"))["levels"][0]
except Exception as e:
    print("no results:", e); sys.exit(0)
r = on["ttft_later_turns_p50_ms"] / off["ttft_later_turns_p50_ms"] if off["ttft_later_turns_p50_ms"] else float("nan")
print(f"ctx {ctx}: later-turn TTFT p50 {on['ttft_later_turns_p50_ms']:.0f} ms with the tier vs {off['ttft_later_turns_p50_ms']:.0f} ms "
      f"without ({r:.2f}x; target <= 0.3x); hit rate later turns {on['cache_hit_rate_later_turns']} vs {off['cache_hit_rate_later_turns']}; "
      f"device/host hits {on.get('device_hit_rate')}/{on.get('host_hit_rate')}, host GB in {on.get('host_loaded_gb')}")
PY
done
