#!/usr/bin/env bash
# Decode/prefill speed on the GPU (issue #22): the CUDA op tests, then `tokenspeed bench` on a random
# Llama-3.1-8B checkpoint (decode bs1/bs64 @1k, bs8/bs16 @32k (bs64 @32k needs 256 GiB of bf16 KV: does not fit), prefill 8k; ceilings in the same run) and,
# where torch is present, the transformers peer (bench/peers) in the same command with ratios; then a
# launches-per-decode-step count with nsys where it is installed (else skipped, printed as such).
# Usage: scripts/gpu_speed.sh BIN_DIR (holding tokenspeed and test_cuda). Logs go to $OUT (default /tmp/out).
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:-${BIN_DIR:?usage: scripts/gpu_speed.sh BIN_DIR}}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm --format=csv,noheader
if [ -x "$B/test_cuda" ]; then
  timeout 300 "$B/test_cuda" --gtest_filter="${TEST_FILTER:-*Attention*:*Norm*:*Rope*:*Kv*:*Linear*:*Silu*}" \
    > "$OUT/test_cuda_speed.log" 2>&1
  echo "test_cuda rc=$?"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|max abs" "$OUT/test_cuda_speed.log" | head -40
fi
timeout 180 "$B/tokenspeed" make-random-model --preset llama-3.1-8b --out /tmp/l8b > "$OUT/make8b.log" 2>&1
echo "make-random-model rc=$?"
timeout 300 "$B/tokenspeed" bench --model /tmp/l8b --device cuda --prompt-lens 8192 --batches 1,64 \
  --contexts 1024 --json "$OUT/ours8b.json" > "$OUT/bench8b.log" 2>&1
echo "bench @1k rc=$?"; grep -v "^\[" "$OUT/bench8b.log" | tail -30
timeout 300 "$B/tokenspeed" bench --model /tmp/l8b --device cuda --prompt-lens 1024 --batches 8,16 \
  --contexts 32768 --json "$OUT/ours8b_32k.json" > "$OUT/bench8b_32k.log" 2>&1
echo "bench @32k rc=$?"; grep -v "^\[" "$OUT/bench8b_32k.log" | tail -20
if python3 -c "import torch, transformers" 2>/dev/null; then
  PYTHONUNBUFFERED=1 timeout ${PEER_TIMEOUT:-360} python3 bench/peers/hf_peer.py --model /tmp/l8b --prompt-lens 8192 \
    --batches 1,64 --contexts 1024 --json "$OUT/peer8b.json" > "$OUT/peer8b.log" 2>&1
  echo "peer rc=$?"; tail -5 "$OUT/peer8b.log"
  python3 bench/peers/compare.py "$OUT/ours8b.json" "$OUT/peer8b.json" 2>&1 | tee "$OUT/compare8b.md"
else
  echo "peer: skipped (no torch/transformers)"
fi
# Ops per layer at bs1 (the goal of #22 is <= 6): `bench --profile` brackets every op of one eager
# decode step with CUDA events; the op count over 32 layers (Llama-3.1-8B) is the launches-per-layer
# proxy (an op may launch more than one kernel; nsys below, where present, counts kernels).
timeout 240 "$B/tokenspeed" bench --model /tmp/l8b --device cuda --prompt-lens 128 --batches 1 --contexts 1024 --profile \
  --json "$OUT/prof_bs1.json" > "$OUT/prof_bs1.log" 2>&1
echo "bench --profile rc=$?"; grep "bench: " "$OUT/prof_bs1.log" | head -40
python3 - "$OUT/prof_bs1.json" <<'PY2' || true
import json, sys
j = json.load(open(sys.argv[1]))
rows = j if isinstance(j, list) else j.get("rows", j.get("results", []))
for r in rows:
    if isinstance(r, dict) and "profile" in r:
        n = sum(o["count"] for o in r["profile"]["ops"])
        print(f"ops per decode step (batch {r.get('batch')}, context {r.get('context')}): {n}; per layer (32): {n / 32:.1f}")
PY2
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
