#!/usr/bin/env bash
# CI smoke test of `tokenspeed bench agentic` against the REAL server on the demo model:
# starts `tokenspeed serve` on a free port, waits for GET /health == 200, runs a tiny benchmark
# (2 levels, 2 conversations of 2 turns, 16 tokens each) and checks every output field.
# Exit 77 (ctest SKIP) when this build has no `serve` command yet.
set -euo pipefail
BIN=${1:?usage: agentic_smoke.sh path/to/tokenspeed}
if ! "$BIN" serve --help >/dev/null 2>&1; then
  echo "SKIP: this build has no 'serve' command"
  exit 77
fi
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
TMP=$(mktemp -d)
"$BIN" serve --host 127.0.0.1 --port "$PORT" >"$TMP/server.log" 2>&1 &
SERVER=$!
cleanup() {
  kill "$SERVER" 2>/dev/null || true
  wait "$SERVER" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

for _ in $(seq 1 600); do
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health" || true)
  [ "$code" = 200 ] && break
  if ! kill -0 "$SERVER" 2>/dev/null; then
    echo "FAIL: the server exited"; cat "$TMP/server.log"; exit 1
  fi
  sleep 0.1
done
if [ "$code" != 200 ]; then
  echo "FAIL: GET /health never returned 200"; cat "$TMP/server.log"; exit 1
fi

start=$(date +%s)
if ! "$BIN" bench agentic --base-url "http://127.0.0.1:$PORT" --out "$TMP/out" --concurrency 1,2 \
    --conversations 2 --turns 2 --first-turn-tokens 300 --turn-tokens 50 --max-tokens 16 --warmup 0 \
    --ignore-eos; then
  echo "FAIL: bench agentic failed"; tail -50 "$TMP/server.log"; exit 1
fi
echo "bench agentic took $(( $(date +%s) - start ))s"

python3 - "$TMP/out" <<'PY'
import csv, json, sys
out = sys.argv[1]
j = json.load(open(out + "/results.json"))
cfg = j["config"]
assert cfg["concurrency"] == [1, 2] and cfg["max_tokens"] == 16 and cfg["ignore_eos"] is True, cfg
assert j["endpoint"]["context_length"] and j["endpoint"]["chars_per_token"] > 0, j["endpoint"]
levels = j["levels"]
assert [l["concurrency"] for l in levels] == [1, 2], levels
positive = ["requests", "duration_s", "per_user_tps", "per_gpu_tpm", "output_tps", "itl_mean_ms", "itl_p50_ms",
            "itl_p99_ms", "ttft_first_turn_p50_ms", "ttft_first_turn_p99_ms", "ttft_later_turns_p50_ms",
            "ttft_later_turns_p99_ms", "prompt_tokens", "completion_tokens", "cached_tokens", "cache_hit_rate",
            "cache_hit_rate_later_turns", "mean_prompt_tokens"]
for l in levels:
    c = l["concurrency"]
    assert l["errors"] == 0, (c, l["first_error"])
    assert l["requests"] == 4, (c, l["requests"])  # 2 conversations x 2 turns
    for k in positive:
        assert isinstance(l[k], (int, float)) and l[k] > 0, (c, k, l[k])
    assert l["completion_tokens"] == 4 * 16, (c, l["completion_tokens"])  # --ignore-eos
    assert l["ttft_first_turn_p99_ms"] >= l["ttft_first_turn_p50_ms"]
    assert 0 < l["cache_hit_rate_later_turns"] <= 1 and l["cache_hit_rate"] <= 1
    assert "accept_length" in l and "truncated_conversations" in l
    assert abs(l["per_gpu_tpm"] - l["output_tps"] * 60) < 1e-6 * l["per_gpu_tpm"]
rows = list(csv.DictReader(open(out + "/results.csv")))
assert [r["concurrency"] for r in rows] == ["1", "2"], rows
assert float(rows[1]["per_gpu_tpm"]) > 0
svg = open(out + "/pareto.svg").read()
import xml.dom.minidom
xml.dom.minidom.parseString(svg)  # well-formed
assert svg.startswith("<svg") and ">c=1</text>" in svg and ">c=2</text>" in svg and "<polyline" in svg
print("agentic smoke: OK")
PY
