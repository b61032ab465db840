#!/usr/bin/env bash
# The grammar's throughput cost on the GPU (#18: <= 3% at batch 64): serve a random-weight
# Llama-3.1-8B-shaped checkpoint (128k byte-level BPE vocabulary) on CUDA with graphs and run the
# same `bench serving` load at concurrency 64 twice: plain, and every request constrained by a
# JSON schema (structured_outputs.json). Prints both tables and the per-token cost (ITL p50) and
# throughput ratio. Usage: scripts/gpu_grammar_cost.sh [BIN_DIR] (default .device/bin); logs to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:-${BIN_DIR:-.device/bin}}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
M=${MODEL_DIR:-/tmp/l8b}
PORT=30021
[ -f $M/config.json ] || { timeout 120 $B/tokenspeed make-random-model --preset llama-3.1-8b --out $M > $OUT/make8b_gc.log 2>&1; echo "make-random-model rc=$?"; }
$B/tokenspeed serve $M --port $PORT --device cuda --max-num-seqs 128 > $OUT/serve_grammar_cost.log 2>&1 &
pid=$!
for _ in $(seq 240); do
  python3 -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$PORT/health').status==200 else 1)" 2>/dev/null && break
  sleep 0.5
done
# Bounded output: the schema ends after a few dozen tokens on random weights; max_tokens caps it.
SCHEMA='{"type":"object","properties":{"id":{"type":"integer","minimum":0,"maximum":100000},"name":{"type":"string","maxLength":48},"tags":{"type":"array","items":{"type":"string","enum":["alpha","beta","gamma"]},"maxItems":4},"ok":{"type":"boolean"}},"required":["id","name","tags","ok"],"additionalProperties":false}'
C=${CONC:-64}
timeout 200 $B/tokenspeed bench serving --base-url http://127.0.0.1:$PORT --concurrency $C --num-prompts $((C * 3)) \
  --prompt-tokens 512 --max-tokens 128 > $OUT/bench_plain.txt 2> $OUT/bench_plain.err; echo "plain rc=$?"
timeout 200 $B/tokenspeed bench serving --base-url http://127.0.0.1:$PORT --concurrency $C --num-prompts $((C * 3)) \
  --prompt-tokens 512 --max-tokens 128 --json-schema "$SCHEMA" > $OUT/bench_schema.txt 2> $OUT/bench_schema.err; echo "schema rc=$?"
kill $pid; wait $pid 2>/dev/null
echo "== plain"; cat $OUT/bench_plain.txt; tail -2 $OUT/bench_plain.err
echo "== json schema"; cat $OUT/bench_schema.txt; tail -2 $OUT/bench_schema.err
python3 - $OUT/bench_plain.txt $OUT/bench_schema.txt <<'PY'
import sys
def row(p):
    l = open(p).read().strip().split('\n')
    h = l[0].split(); v = l[1].split()
    return dict(zip(h, map(float, v)))
a, b = row(sys.argv[1]), row(sys.argv[2])
print(f"grammar cost at concurrency {int(a['concurrency'])}: out_tok/s {b['out_tok/s']:.0f} vs {a['out_tok/s']:.0f} "
      f"({100 * (1 - b['out_tok/s'] / a['out_tok/s']):.1f}% lower), itl_p50 {b['itl_p50ms']:.2f} vs {a['itl_p50ms']:.2f} ms "
      f"({100 * (b['itl_p50ms'] / a['itl_p50ms'] - 1):.1f}% higher)")
PY
