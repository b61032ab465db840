#!/usr/bin/env bash
# The grammar's throughput cost on the GPU (#18: <= 3% at batch 64): serve a random-weight
# Llama-3.1-8B-shaped checkpoint (128k byte-level BPE vocabulary) on CUDA with graphs and run the
# same `bench serving` load at concurrency 64: plain, every request constrained by a JSON schema
# (structured_outputs.json), and chat with tools + tool_choice auto (a triggered grammar: free
# text until the model opens a call; random weights rarely do, so this measures what every
# request with tools pays -- before, such requests forced the simple loop). The schema run goes
# once with jump-forward (default) and twice, interleaved with plain runs, on a server with
# --disable-jump-forward (masked tokens only, the overlap loop with masks inside the decode
# graphs; LONG_SCHEMA, whose outputs run to max_tokens as plain's do); tools none / auto interleave twice too. Prints the tables, the cost of each against its
# baseline (out tok/s, ITL p50; the mean of the two runs where there are two) and FAIL lines where
# the schema runs without jump-forward have a per-token time (ITL p50) more than 3% above plain on
# the same server, or tools + auto loses more than 3% of tool_choice none's throughput; exit 1 then.
# Usage: scripts/gpu_grammar_cost.sh [BIN_DIR] (default .device/bin); logs to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:-${BIN_DIR:-.device/bin}}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
M=${MODEL_DIR:-/tmp/l8b}
PORT=30021
[ -f $M/config.json ] || { timeout 120 $B/tokenspeed make-random-model --preset llama-3.1-8b --out $M > $OUT/make8b_gc.log 2>&1; echo "make-random-model rc=$?"; }
serve() {  # extra serve flags
  $B/tokenspeed serve $M --port $PORT --device ${DEVICE:-cuda} --max-num-seqs 128 "$@" > $OUT/serve_grammar_cost_$#.log 2>&1 &
  pid=$!
  for _ in $(seq 240); do
    python3 -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$PORT/health').status==200 else 1)" 2>/dev/null && return 0
    sleep 0.5
  done
  echo "FAIL server did not start ($*)"; tail -3 $OUT/serve_grammar_cost_$#.log; return 1
}
# Bounded output: the schema ends after a few dozen tokens on random weights; max_tokens caps it.
SCHEMA='{"type":"object","properties":{"id":{"type":"integer","minimum":0,"maximum":100000},"name":{"type":"string","maxLength":48},"tags":{"type":"array","items":{"type":"string","enum":["alpha","beta","gamma"]},"maxItems":4},"ok":{"type":"boolean"}},"required":["id","name","tags","ok"],"additionalProperties":false}'
# The hard check's schema cannot end within max_tokens (50 objects of ~10 tokens each), so its
# requests run as long as the plain ones (ignore_eos): equal lengths, equal prefill share, and the
# ITL difference is the grammar's (the short schema above ends after a few dozen tokens, so its
# load has several times the prefill per output token).
LONG_SCHEMA='{"type":"array","minItems":50,"items":{"type":"object","properties":{"id":{"type":"integer"},"name":{"type":"string","maxLength":12},"ok":{"type":"boolean"}},"required":["id","name","ok"],"additionalProperties":false}}'
TOOLS='[{"type":"function","function":{"name":"get_weather","description":"Current weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["c","f"]}},"required":["city"]}}},{"type":"function","function":{"name":"search","parameters":{"type":"object","properties":{"query":{"type":"string"}},"required":["query"]}}}]'
C=${CONC:-64}
bench() {  # name, extra bench flags
  local name=$1; shift
  timeout 200 $B/tokenspeed bench serving --base-url http://127.0.0.1:$PORT --concurrency $C --num-prompts $((C * 3)) \
    --prompt-tokens 512 --max-tokens 128 "$@" > $OUT/bench_$name.txt 2> $OUT/bench_$name.err; echo "$name rc=$?"
}
# Each comparison runs on one server, after a warm-up load, its two sides interleaved A B A B
# (one server's start, cache state and clocks drift less than two servers': the first H100 run
# compared a cold server's plain run with another server's schema run).
if serve; then
  bench warmup
  bench plain
  bench schema --json-schema "$SCHEMA"
  for i in 1 2; do
    bench tools_plain_chat_$i --tools "$TOOLS" --tool-choice none
    bench tools_auto_$i --tools "$TOOLS" --tool-choice auto
  done
  kill $pid; wait $pid 2>/dev/null
fi
if serve --disable-jump-forward; then
  bench warmup_nj
  for i in 1 2; do
    bench plain_nj_$i
    bench schema_nojump_$i --json-schema "$LONG_SCHEMA"
  done
  kill $pid; wait $pid 2>/dev/null
fi
for n in plain schema plain_nj_1 schema_nojump_1 plain_nj_2 schema_nojump_2 tools_plain_chat_1 tools_auto_1 \
    tools_plain_chat_2 tools_auto_2; do
  echo "== $n"; cat $OUT/bench_$n.txt 2>/dev/null; tail -2 $OUT/bench_$n.err 2>/dev/null
done
python3 - $OUT <<'PY'
import os, sys
out = sys.argv[1]
def row1(n):
    p = os.path.join(out, f"bench_{n}.txt")
    if not os.path.exists(p): return None
    l = open(p).read().strip().split('\n')
    if len(l) < 2: return None
    h = l[0].split(); v = l[1].split()
    try: return dict(zip(h, map(float, v)))
    except ValueError: return None
def row(n):  # a name with runs n_1, n_2: their mean (failed: summed)
    one = row1(n)
    if one: return one
    runs = [r for r in (row1(f"{n}_1"), row1(f"{n}_2")) if r]
    if len(runs) < 2: return None
    m = {k: sum(r[k] for r in runs) / len(runs) for k in runs[0]}
    m['failed'] = sum(r['failed'] for r in runs)
    return m
rc = 0
def cost(name, base, hard):  # hard: None, "tok" (out tok/s) or "itl" (ITL p50)
    global rc
    a, b = row(base), row(name)
    if not a or not b:
        print(f"FAIL {name}: no result"); rc = 1; return
    loss = 100 * (1 - b['out_tok/s'] / a['out_tok/s'])
    itl = 100 * (b['itl_p50ms'] / a['itl_p50ms'] - 1)
    print(f"{name} vs {base} at concurrency {int(a['concurrency'])}: out_tok/s {b['out_tok/s']:.0f} vs {a['out_tok/s']:.0f} "
          f"({loss:.1f}% lower), itl_p50 {b['itl_p50ms']:.2f} vs {a['itl_p50ms']:.2f} ms ({itl:.1f}% higher), "
          f"failed {int(b['failed'])}")
    if b['failed'] > 0:
        print(f"FAIL {name}: {int(b['failed'])} failed requests"); rc = 1
    if hard == "tok" and loss > 3.0:
        print(f"FAIL {name}: {loss:.1f}% > 3% throughput cost"); rc = 1
    if hard == "itl" and itl > 3.0:
        print(f"FAIL {name}: per-token time (ITL p50) {itl:.1f}% > 3% higher"); rc = 1
# The schema runs end where the grammar does: their tok/s is over shorter requests (more prefill
# per token), so their per-token cost is the ITL line; jump-forward also emits tokens it never
# sampled (chunks of them arrive together). The tools runs have the same lengths (ignore_eos).
cost("schema_nojump", "plain_nj", "itl")
cost("schema", "plain", None)
cost("tools_plain_chat", "plain", None)
cost("tools_auto", "tools_plain_chat", "tok")
sys.exit(rc)
PY
