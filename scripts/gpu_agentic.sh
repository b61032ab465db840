#!/usr/bin/env bash
# On the GPU machine (#18 items 1-2): grammar masks inside the decode CUDA graphs, constrained
# requests in the overlap loop, jump-forward. Runs, each with a hard pass/fail:
#  1. test_cuda: CudaGrammarGraphs.* (masked sampling inside the graphs == eager logits + CPU
#     bitmask + CPU sampler; every masked id allowed), CudaGrammarEngine.* (overlap == simple loop
#     with graphs and eager, device masks == host-logits path, jump-forward takes fewer steps and
#     stays valid; graphs-vs-eager and batched agreement printed), and the suites the split decode
#     graph touches: CudaBitmask.*, CudaGraphs.*, CudaLogitsProcEngine.*, SpecGraphs.* (EAGLE3).
#  2. the server on --device cuda (demo model, graphs, overlap): a json_schema request, a chat
#     request with tools + tool_choice required and one with tool_choice auto; outputs validated.
# Usage: scripts/gpu_agentic.sh [BIN_DIR] (default .device/bin: tokenspeed and test_cuda). Logs to
# $OUT (default /tmp/out). Prints one PASS/FAIL line per check; exit status 1 on any FAIL.
# SKIP_TEST_CUDA=1: only the server part (when gpu_verify.sh ran every suite in the same command).
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:-${BIN_DIR:-.device/bin}}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
rc=0
pass() { echo "PASS $*"; }
failc() { echo "FAIL $*"; rc=1; }

if [ -n "${SKIP_TEST_CUDA:-}" ]; then
  echo "test_cuda: skipped (SKIP_TEST_CUDA: the suites ran elsewhere, e.g. scripts/gpu_verify.sh)"
elif [ -x "$B/test_cuda" ]; then
  F='CudaGrammarGraphs.*:CudaGrammarEngine.*:CudaBitmask.*:CudaGraphs.*:CudaLogitsProcEngine.*:SpecGraphs.*'
  timeout 200 "$B/test_cuda" --gtest_filter="$F" > "$OUT/agentic_test_cuda.log" 2>&1
  r=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|agreement|steps:|  \[decode" "$OUT/agentic_test_cuda.log" | tail -20
  grep -E "^\[  FAILED  \]" "$OUT/agentic_test_cuda.log" | sort -u | head -20
  if ! grep -q "OK \] CudaGrammarGraphs.MaskedSamplingInsideDecodeGraphMatchesEager" "$OUT/agentic_test_cuda.log"; then
    failc "test_cuda: the grammar graph tests did not run (skipped: no GPU?) rc=$r"
  elif [ $r -eq 0 ]; then pass "test_cuda $F"; else failc "test_cuda rc=$r (log: $OUT/agentic_test_cuda.log)"; fi
else
  failc "no $B/test_cuda"
fi

PORT=${PORT:-30031}
"$B/tokenspeed" serve models/pycoder --port $PORT --device ${DEVICE:-cuda} --max-num-seqs 16 > "$OUT/agentic_serve.log" 2>&1 &
pid=$!
up=0
for _ in $(seq 240); do
  python3 -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$PORT/health').status==200 else 1)" 2>/dev/null && { up=1; break; }
  sleep 0.5
done
if [ $up -eq 1 ]; then
  timeout 120 python3 - $PORT > "$OUT/agentic_server.log" 2>&1 <<'PY'
import json, sys, urllib.request
port = sys.argv[1]
def post(path, body):
    r = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(r, timeout=60))
ok = True
MODEL = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30))["data"][0]["id"]
schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
          "age": {"type": "integer", "minimum": 0, "maximum": 99}, "kind": {"enum": ["def", "class", "lambda"]}},
          "required": ["name", "age", "kind"], "additionalProperties": False}
for i in range(3):
    r = post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": f"describe function {i}"}],
             "max_tokens": 200, "temperature": 0,
             "response_format": {"type": "json_schema", "json_schema": {"name": "f", "schema": schema, "strict": True}}})
    c = r["choices"][0]["message"]["content"]
    try:
        j = json.loads(c); good = set(j) == {"name", "age", "kind"} and j["kind"] in ("def", "class", "lambda")
    except Exception:
        good = False
    print(("PASS" if good else "FAIL"), "json_schema", i, repr(c), r["usage"])
    ok &= good
tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
          "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}}]
r = post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "weather in Paris?"}],
         "tools": tools, "tool_choice": "required", "max_tokens": 200, "temperature": 0})
calls = r["choices"][0]["message"].get("tool_calls") or []
good = len(calls) >= 1 and all(c["function"]["name"] == "get_weather" and "city" in json.loads(c["function"]["arguments"]) for c in calls)
print(("PASS" if good else "FAIL"), "tool_choice required", json.dumps(calls)[:300])
ok &= good
r = post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "weather in Paris?"}],
         "tools": tools, "tool_choice": "auto", "max_tokens": 48, "temperature": 0})
m = r["choices"][0]["message"]
good = r["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")
print(("PASS" if good else "FAIL"), "tool_choice auto", repr(m.get("content"))[:200], json.dumps(m.get("tool_calls"))[:200])
ok &= good
sys.exit(0 if ok else 1)
PY
  r=$?
  cat "$OUT/agentic_server.log"
  [ $r -eq 0 ] && pass "server json_schema / tools on cuda" || failc "server checks rc=$r"
  python3 -c "import urllib.request; print([l for l in urllib.request.urlopen('http://127.0.0.1:$PORT/metrics').read().decode().splitlines() if l.startswith(('tokenspeed_engine_overlap_steps_total', 'tokenspeed_engine_steps_total'))])"
else
  failc "server did not start"; tail -5 "$OUT/agentic_serve.log"
fi
kill $pid 2>/dev/null; wait $pid 2>/dev/null
echo "gpu_agentic: $([ $rc -eq 0 ] && echo ALL PASS || echo SOME FAIL)"
exit $rc
