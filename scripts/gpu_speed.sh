#!/usr/bin/env bash
# Decode/prefill speed on the GPU (issue #22): the CUDA op tests, then `tokenspeed bench` on a random
# Llama-3.1-8B checkpoint (decode bs1/bs64 @1k, bs1/bs8/bs16 @32k (bs64 @32k needs 256 GiB of bf16 KV: does not fit), prefill 8k; ceilings in the same run),
# the fused greedy LM head vs --unfused-head (bs1/bs2, same run), the split-KV attention lab (`bench --attention-lab`) and,
# where torch is present, the transformers peer (bench/peers) in the same command with ratios; then a
# launches-per-decode-step count with nsys where it is installed (else skipped, printed as such).
# Usage: scripts/gpu_speed.sh BIN_DIR (holding tokenspeed and test_cuda). Logs go to $OUT (default /tmp/out).
# SKIP_PEER=1: no transformers peer (saves ~5 min); GOLDENS="llama3 ...": the golden fixtures to check.
# BASE_BIN=DIR (optional): a baseline build (e.g. main before the #22 fusions) whose ops per layer and
# bs1/bs64 tok/s are printed next to this build's ("before" / "after").
set -uo pipefail
# The repository root: the script's parent, else the current directory, else /work/main (the lead
# runs a copy of this script from .devmid/<name>/, where bench/peers and tests/data are not).
ROOT=$(cd "$(dirname "$0")/.." && pwd)
for r in "$ROOT" "$PWD" /work/main; do [ -d "$r/bench/peers" ] && { ROOT=$r; break; }; done
cd "$ROOT"
B=${1:-${BIN_DIR:?usage: scripts/gpu_speed.sh BIN_DIR}}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm --format=csv,noheader
# The CUDA tests one suite group per process (an abort only loses its group), summary lines to
# stdout, the failures' context too. Tests that load models/pycoder need the checkout's models/.
if [ -x "$B/test_cuda" ]; then
  : > "$OUT/test_cuda_speed.log"
  for f in ${TEST_GROUPS:-CudaLmHeadArgmax.* CudaAttention.* CudaOps.*Fused*:CudaOps.*Norm*:CudaOps.*Rope*:CudaOps.Linear*:CudaOps.SiluMul:CudaOps.KvWrite CudaSampling.* CudaGraphs.*}; do
    timeout 300 "$B/test_cuda" --gtest_filter="$f" > "$OUT/t.log" 2>&1; rc=$?
    cat "$OUT/t.log" >> "$OUT/test_cuda_speed.log"
    echo "test_cuda $f rc=$rc"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|Failure|what\(\)|Abort" "$OUT/t.log" | head -20
    [ $rc -ne 0 ] && { echo "--- last 30 lines ($f) ---"; tail -30 "$OUT/t.log"; }
  done
  rm -f "$OUT/t.log"
fi
# Goldens on CUDA (the fused decode path must keep them): the dense models (Llama, Qwen3 q/k norm).
if [ -d tests/data/llama3 ]; then
  for m in ${GOLDENS:-llama3 llama2_mha qwen3}; do
    echo "golden $m:"; timeout 60 "$B/tokenspeed" verify-golden tests/data/$m --device cuda --atol 0.1 2>&1 | tail -3
  done 2>&1 | tee "$OUT/golden_speed.log"
else
  echo "goldens: skipped (no tests/data here: run from a checkout)"
fi
timeout 180 "$B/tokenspeed" make-random-model --preset llama-3.1-8b --out /tmp/l8b > "$OUT/make8b.log" 2>&1
echo "make-random-model rc=$?"
# Decode rows: "bench: decode batch B context C: ... tok/s ... (% of copy)"; ceilings first.
key() { grep -E "copy|GEMM|ceiling|bench: (decode|prefill)" "$1" | grep -v "^\[" | head -${2:-20}; }
timeout 300 "$B/tokenspeed" bench --model /tmp/l8b --device cuda --prompt-lens 8192 --batches 1,64 \
  --contexts 1024 --json "$OUT/ours8b.json" > "$OUT/bench8b.log" 2>&1
echo "bench @1k rc=$?"; grep -v "^\[" "$OUT/bench8b.log" | tail -30
# Same-run A/B of the fused greedy LM head (ops::lm_head_argmax: batch 1-2) vs logits + sampling.
timeout 240 "$B/tokenspeed" bench --model /tmp/l8b --device cuda --prompt-lens 128 --batches 1,2 --contexts 1024 \
  --json "$OUT/head_fused.json" > "$OUT/head_fused.log" 2>&1
echo "bench fused head rc=$?"; grep "bench: decode" "$OUT/head_fused.log" | sed 's/^/[fused head]   /'
timeout 240 "$B/tokenspeed" bench --model /tmp/l8b --device cuda --prompt-lens 128 --batches 1,2 --contexts 1024 \
  --unfused-head --json "$OUT/head_unfused.json" > "$OUT/head_unfused.log" 2>&1
echo "bench unfused head rc=$?"; grep "bench: decode" "$OUT/head_unfused.log" | sed 's/^/[unfused head] /'
timeout 360 "$B/tokenspeed" bench --model /tmp/l8b --device cuda --prompt-lens 1024 --batches 1,8,16 \
  --contexts 32768 --json "$OUT/ours8b_32k.json" > "$OUT/bench8b_32k.log" 2>&1
echo "bench @32k rc=$?"; grep -v "^\[" "$OUT/bench8b_32k.log" | tail -20
# Split-KV decode attention alone (8B shapes): default splits vs batch-invariant splits.
timeout 300 "$B/tokenspeed" bench --attention-lab > "$OUT/attention_lab.md" 2> "$OUT/attention_lab.log"
echo "attention lab rc=$?"; cat "$OUT/attention_lab.md"
if [ -z "${SKIP_PEER:-}" ] && python3 -c "import torch, transformers" 2>/dev/null; then
  PYTHONUNBUFFERED=1 timeout ${PEER_TIMEOUT:-360} python3 bench/peers/hf_peer.py --model /tmp/l8b --prompt-lens 8192 \
    --batches 1,64 --contexts 1024 --json "$OUT/peer8b.json" > "$OUT/peer8b.log" 2>&1
  echo "peer rc=$?"; tail -5 "$OUT/peer8b.log"
  python3 bench/peers/compare.py "$OUT/ours8b.json" "$OUT/peer8b.json" 2>&1 | tee "$OUT/compare8b.md"
else
  echo "peer: skipped (SKIP_PEER set or no torch/transformers)"
fi
# Ops per layer at bs1 (the goal of #22 is <= 6): `bench --profile` brackets every op of one eager
# decode step with CUDA events; the op count over 32 layers (Llama-3.1-8B) is the launches-per-layer
# proxy (an op may launch more than one kernel; nsys below, where present, counts kernels).
profile_ops() {  # $1: bin dir, $2: tag
  timeout 240 "$1/tokenspeed" bench --model /tmp/l8b --device cuda --prompt-lens 128 --batches 1 --contexts 1024 --profile \
    --json "$OUT/prof_bs1_$2.json" > "$OUT/prof_bs1_$2.log" 2>&1
  echo "bench --profile ($2) rc=$?"; grep "bench: " "$OUT/prof_bs1_$2.log" | head -40
  python3 - "$OUT/prof_bs1_$2.json" "$2" <<'PY2' || true
import json, sys
j = json.load(open(sys.argv[1]))
rows = j if isinstance(j, list) else j.get("rows", j.get("results", []))
for r in rows:
    if isinstance(r, dict) and "profile" in r:
        n = sum(o["count"] for o in r["profile"]["ops"])
        print(f"[{sys.argv[2]}] ops per decode step (batch {r.get('batch')}, context {r.get('context')}): {n}; per layer (32): {n / 32:.1f}")
PY2
}
profile_ops "$B" after
# Where a bs64 @1k and a bs8 @32k step go (attention vs linears), one profiled step each.
timeout 300 "$B/tokenspeed" bench --model /tmp/l8b --device cuda --prompt-lens 128 --batches 64 --contexts 1024 --profile \
  > "$OUT/prof_bs64_1k.log" 2>&1
echo "bench --profile bs64@1k rc=$?"; grep "bench: " "$OUT/prof_bs64_1k.log" | grep -A14 "profile decode" | head -16
timeout 300 "$B/tokenspeed" bench --model /tmp/l8b --device cuda --prompt-lens 128 --batches 8 --contexts 32768 --profile \
  > "$OUT/prof_bs8_32k.log" 2>&1
echo "bench --profile bs8@32k rc=$?"; grep "bench: " "$OUT/prof_bs8_32k.log" | grep -A14 "profile decode" | head -16
if [ -n "${BASE_BIN:-}" ] && [ -x "$BASE_BIN/tokenspeed" ]; then
  profile_ops "$BASE_BIN" before
  timeout 300 "$BASE_BIN/tokenspeed" bench --model /tmp/l8b --device cuda --prompt-lens 8192 --batches 1,64 \
    --contexts 1024 --json "$OUT/base8b.json" > "$OUT/base8b.log" 2>&1
  echo "baseline bench @1k rc=$?"; echo "--- before (BASE_BIN) ---"; grep -v "^\[" "$OUT/base8b.log" | grep -i "decode" | head -10
  echo "--- after (this build) ---"; grep -v "^\[" "$OUT/bench8b.log" | grep -i "decode" | head -10
fi
# Launches per decode step: count kernel launches of a short graph-mode decode with nsys, divided by
# the steps and layers (32 for Llama-3.1-8B) by the reader; the raw kernel table is in the log.
if command -v nsys > /dev/null; then
  timeout 240 nsys profile -o "$OUT/decode_bs1" --force-overwrite true --cuda-graph-trace=node \
    "$B/tokenspeed" bench-decode --model /tmp/l8b --device cuda --graphs --prompt-tokens 1024 --gen-tokens 16 \
    > "$OUT/nsys_decode.log" 2>&1
  echo "nsys rc=$?"
  nsys stats --report cuda_gpu_kern_sum "$OUT/decode_bs1.nsys-rep" > "$OUT/kern_sum.log" 2>&1
  head -40 "$OUT/kern_sum.log"; rm -f "$OUT"/decode_bs1.nsys-rep "$OUT"/decode_bs1.sqlite
else
  echo "launch count: skipped (nsys absent)"
fi
# Every log in one file (only a few files come back from a device run).
tar -C "$OUT" -czf /tmp/speed_logs.tgz . 2>/dev/null && mv /tmp/speed_logs.tgz "$OUT/logs.tgz" && echo "logs: $OUT/logs.tgz"
