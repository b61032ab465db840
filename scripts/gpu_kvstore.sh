#!/usr/bin/env bash
# The host KV tier (KvStore) on the GPU machine, self-checking (a PASS/FAIL line per target,
# non-zero exit on any FAIL). Whole run: about 4-5 minutes (most of it the 8B servers' starts).
#  1. tests/cuda/kv_store_test.cpp (KvStoreCuda*): copy-stream round trip (MHA + MLA pools), the
#     load GB/s of a 32k-token prefix of Llama-3.1-8B shapes from pinned host memory (target
#     >= 20 GB/s, scattered blocks: the worst case), the staged load (the compute stream is free
#     while a 4 GiB load copies), and the 2-GPU rank test (skipped on one GPU).
#  2. `bench agentic` on a random-weight Llama-3.1-8B (real shapes) at 8k and 32k tokens per
#     conversation, 4 conversations over a device pool that holds 2, tier on and off. The table:
#     later-turn TTFT p50 on/off and their ratio (target <= 0.3x), ITL p99, host-tier load GB/s
#     (device time of the loads), and the time model of a later turn:
#       with the tier:    TTFT = queue (waiting for device blocks) + load + prefill of the new turn
#       without the tier: TTFT = queue + re-prefill of the whole history
#     from the server's per-phase sums (tokenspeed_kvstore_loaded_request_seconds_total for the
#     requests that loaded from the host tier; vllm:request_{queue,prefill}_time_seconds for all
#     requests of the run without the tier). "service ratio" = (load + prefill) / re-prefill:
#     the TTFT ratio without the queueing both runs share.
# Usage: scripts/gpu_kvstore.sh [BIN_DIR]   (default .device/bin; every log in $OUT/kvstore_logs.tgz,
# OUT default /tmp/out). Env: CTX ("8192 32768"), CONVS (4), MODEL (/tmp/l8b, made once),
# KVSTORE_GB (24: the 32k run holds ~17 GB of distinct blocks; pinning is paid at each start),
# BUDGET_S (260: later server runs are skipped, and reported as FAIL, past it).
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:-${BIN_DIR:-.device/bin}}
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
[ -d "$B" ] || { [ -f .device/bin.tar.xz ] && tar -C .device -xJf .device/bin.tar.xz; }
OUT=${OUT:-/tmp/out}
MODEL=${MODEL:-/tmp/l8b}
LOGS=/tmp/kvstore_logs  # tarred into $OUT at the end (few files come back from a device run)
rm -rf "$LOGS"; mkdir -p "$LOGS" "$OUT"
PORT=30013
FAILS=0
START=$(date +%s)
left() { [ $(( $(date +%s) - START )) -lt "${BUDGET_S:-260}" ]; }
export NCCL_NVLS_ENABLE=0
verdict() {  # name, ok(0/1), detail
  if [ "$2" = 1 ]; then echo "PASS $1: $3"; else echo "FAIL $1: $3"; FAILS=$((FAILS + 1)); fi
}

echo "== 1. KvStoreCuda (copy streams, 32k-token 8B-shape load bandwidth, staged load)"
timeout 240 "$B"/test_cuda --gtest_filter='KvStoreCuda*' > "$LOGS/kvstore_cuda.log" 2>&1
rc=$?
grep -E "kvstore (load|staged)|OK \]|FAILED|SKIPPED" "$LOGS/kvstore_cuda.log"
verdict "KvStoreCuda tests" $([ $rc = 0 ] && echo 1 || echo 0) "rc=$rc"
gbs=$(grep -oE "scattered blocks: [0-9.]+ ms, [0-9.]+ GB/s" "$LOGS/kvstore_cuda.log" | awk '{print $5}')
verdict "32k-token prefix load >= 20 GB/s (scattered blocks)" \
  $(awk -v g="${gbs:-0}" 'BEGIN {print (g >= 20) ? 1 : 0}') "${gbs:-none} GB/s"

echo "== 2. bench agentic, random Llama-3.1-8B, 4 conversations over a pool of 2, tier on / off"
[ -f "$MODEL/config.json" ] || { timeout 300 "$B"/tokenspeed make-random-model --preset llama-3.1-8b --out "$MODEL" \
  > "$LOGS/make8b.log" 2>&1 || { echo "FAIL make-random-model"; exit 1; }; }
wait_ready() {
  for _ in $(seq 600); do
    curl -sf -o /dev/null "http://127.0.0.1:$PORT/health" 2>/dev/null && return 0
    sleep 0.5
  done
  return 1
}
CONVS=${CONVS:-4}
for ctx in ${CTX:-8192 32768}; do
  # A device pool that holds about half the conversations (each grows to ~ctx + 3 x 288 tokens).
  pool=$(( (ctx + 1024) * CONVS / 2 ))
  # on: the default write-through policy; wb (8k only): write_back, evictions copy on the way.
  tiers="on off"
  [ "$ctx" = 8192 ] && tiers="on wb off"
  for tier in $tiers; do
    # Decode graphs up to batch 8 only and eager prefill: a short start (the runs are 4 users).
    flags=(--max-total-tokens $pool --context-length $(( ctx + 4096 )) --kvstore-size ${KVSTORE_GB:-24}
           --cuda-graph-max-bs 8 --disable-prefill-graph)
    [ $tier = off ] && flags+=(--disable-kvstore)
    [ $tier = wb ] && flags+=(--kvstore-write-policy write_back)
    name=ctx${ctx}_tier_$tier
    if ! left; then echo "FAIL $name: skipped, past the time budget"; FAILS=$((FAILS + 1)); continue; fi
    "$B"/tokenspeed serve "$MODEL" --port $PORT --device cuda "${flags[@]}" > "$LOGS/serve_$name.log" 2>&1 &
    pid=$!
    if ! wait_ready; then echo "FAIL server $name did not start"; tail -5 "$LOGS/serve_$name.log"; kill $pid; FAILS=$((FAILS + 1)); continue; fi
    grep -E "kvstore:" "$LOGS/serve_$name.log" | sed 's/^.*\] //'
    timeout 600 "$B"/tokenspeed bench agentic --base-url http://127.0.0.1:$PORT --out "$LOGS/$name" \
      --concurrency $CONVS --conversations $CONVS --turns 4 --first-turn-tokens $ctx --turn-tokens 256 \
      --max-tokens 32 --warmup 0 --ignore-eos --no-progress > "$LOGS/bench_$name.log" 2>&1
    curl -s "http://127.0.0.1:$PORT/metrics" > "$LOGS/metrics_$name.txt"
    kill $pid; wait $pid 2>/dev/null
  done
done

python3 - "$LOGS" ${CTX:-8192 32768} <<'PY'
import json, re, sys
out, ctxs = sys.argv[1], sys.argv[2:]
def metrics(name):
    m = {}
    try:
        for line in open(f"{out}/metrics_{name}.txt"):
            if line.startswith("#") or not line.strip():
                continue
            k, v = line.rsplit(" ", 1)
            base = re.sub(r"\{.*\}", "", k)
            ph = re.search(r'phase="(\w+)"', k)
            key = base + (":" + ph.group(1) if ph else "")
            m[key] = m.get(key, 0.0) + float(v)
    except OSError:
        pass
    return m
def level(name):
    try:
        return json.load(open(f"{out}/{name}/results.json"))["levels"][0]
    except Exception as e:
        print(f"no results for {name}: {e}")
        return None
fails = 0
def verdict(what, ok, detail):
    global fails
    print(("PASS " if ok else "FAIL ") + what + ": " + detail)
    fails += 0 if ok else 1
print("| context | later-turn TTFT p50 on / off (ms) | ratio | ITL p99 on / off (ms) | host hit rate | load GB/s "
      "| on: queue + load + prefill (ms, mean of loaded turns) | off: queue + re-prefill (ms, mean) | service ratio |")
print("|---|---|---|---|---|---|---|---|---|")
rows = []
import os
runs = [(c, "on") for c in ctxs] + [(c, "wb") for c in ctxs if os.path.exists(f"{out}/ctx{c}_tier_wb/results.json")]
for ctx, tier in runs:
    label = ctx if tier == "on" else f"{ctx} write_back"
    on, off = level(f"ctx{ctx}_tier_{tier}"), level(f"ctx{ctx}_tier_off")
    mon, moff = metrics(f"ctx{ctx}_tier_{tier}"), metrics(f"ctx{ctx}_tier_off")
    if not on or not off or not off.get("ttft_later_turns_p50_ms"):
        verdict(f"ctx {label} bench runs", False, "missing results")
        continue
    ratio = on["ttft_later_turns_p50_ms"] / off["ttft_later_turns_p50_ms"]
    ld_s = mon.get("tokenspeed_kvstore_load_seconds_total", 0)
    ld_b = mon.get("tokenspeed_kvstore_load_completed_bytes_total", 0)
    gbs = ld_b / ld_s / 1e9 if ld_s else float("nan")
    n = mon.get("tokenspeed_kvstore_loaded_requests_total", 0)
    ph = {p: 1e3 * mon.get("tokenspeed_kvstore_loaded_request_seconds_total:" + p, 0) / n if n else float("nan")
          for p in ("queue", "load", "prefill")}
    def hmean(m, name):
        c = m.get(name + "_count", 0)
        return 1e3 * m.get(name + "_sum", 0) / c if c else float("nan")
    q_off, p_off = hmean(moff, "vllm:request_queue_time_seconds"), hmean(moff, "vllm:request_prefill_time_seconds")
    service = (ph["load"] + ph["prefill"]) / p_off if p_off == p_off and p_off > 0 else float("nan")
    print(f"| {label} | {on['ttft_later_turns_p50_ms']:.0f} / {off['ttft_later_turns_p50_ms']:.0f} | {ratio:.2f}x "
          f"| {on.get('itl_p99_ms') or 0:.0f} / {off.get('itl_p99_ms') or 0:.0f} | {on.get('host_hit_rate')} | {gbs:.1f} "
          f"| {ph['queue']:.0f} + {ph['load']:.0f} + {ph['prefill']:.0f} ({n:.0f} turns) | {q_off:.0f} + {p_off:.0f} "
          f"| {service:.2f}x |")
    if tier == "on":
        rows.append((ctx, ratio, service, gbs, on))
for ctx, ratio, service, gbs, on in rows:
    verdict(f"ctx {ctx}: later-turn TTFT p50 with the tier <= 0.3x without", ratio <= 0.3, f"{ratio:.2f}x")
    verdict(f"ctx {ctx}: later turns hit the host tier", (on.get("host_hit_rate") or 0) > 0,
            f"host hit rate {on.get('host_hit_rate')}")
    print(f"INFO ctx {ctx}: service ratio (load + new-turn prefill) / re-prefill = {service:.2f}x; "
          f"host-tier load {gbs:.1f} GB/s (device time)")
sys.exit(1 if fails else 0)
PY
py=$?
[ $py = 0 ] || FAILS=$((FAILS + 1))
tar -C /tmp -czf "$OUT/kvstore_logs.tgz" kvstore_logs 2>/dev/null
echo "== summary: $FAILS failing check(s), $(( $(date +%s) - START )) s; logs in $OUT/kvstore_logs.tgz"
[ $FAILS = 0 ]
