#!/usr/bin/env bash
# Issue #8 on one GPU machine, with prebuilt binaries (scripts/device_bundle.sh; it ships
# tokenspeed and every lab_* by default — `LABS=build/lab_moe scripts/device_bundle.sh` is enough
# here). Under 6 minutes. Logs go to $OUT; a summary is printed at the end.
#  tests:  the CUDA tests of these tools (op profiler, pinned host logits, route hook) and the MoE ops
#  route:  route-diff on the long prompt of qwen3_moe, deepseek_v3, minimax_m3 (bf16 routing flips?)
#  q30:    Qwen3-30B-A3B shapes, 8 of 48 layers: bench b1,b64 at 1k context with --profile (per-op
#          device time, device idle gaps, logits to host pageable vs pinned), then the same with
#          --host-logits (the old bench step: logits to the host every step, now a pinned buffer)
#  dense:  Llama-3.1-8B shapes, 8 of 32 layers: b64,b128 at 1k with --profile (the B=128 anomaly:
#          64 x 128k f32 logits are 32.8 MB, 128 x 128k are 65.7 MB, past glibc's 32 MiB mmap cap)
#  lab:    lab_moe (the kernel-lab figure the model is compared with)
#  route2: (not in the default) the follow-up, in ONE log ($OUT/route2.log) and a compact summary
#          on stdout, under 2 minutes: the CUDA tests of the route / block-select hooks (the block
#          kernel check on a 200-token prompt), the block-sparse and MLA kernels; route-diff on every
#          prompt of the three MoE fixtures (per prompt: flips and the logit error free, with the
#          CPU routing forced, with routing + blocks forced; details of the worst prompt: flips,
#          score gaps, the sparse kernel check on the model's own inputs, per-layer hidden error)
# Usage: scripts/gpu_moe_diag.sh [steps] (default tests,route,q30,dense,lab); a step starting after
# 300 s is skipped and every command is cut at 345 s, so the whole run stays under 6 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=.device/bin
[ -d $B ] || tar -C .device -xJf .device/bin.tar.xz
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
STEPS=${1:-tests,route,q30,dense,lab}
has() { [[ ",$STEPS," == *",$1,"* ]]; }
T0=$SECONDS
late() {
  if (( SECONDS - T0 > 300 )); then echo "skipped $1: past 300 s" | tee -a "$OUT/skipped.log"; return 0; fi
  return 1
}
# timeout for a command: at most $1 s and never past 345 s from the start.
tmo() {
  local left=$(( 345 - (SECONDS - T0) ))
  (( left < 5 )) && left=5
  echo $(( $1 < left ? $1 : left ))
}
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm --format=csv,noheader

if has tests && ! late tests; then
  timeout $(tmo 60) $B/test_cuda --gtest_filter='OpProfiler*:ModelRunnerCuda*:MoeRouteHookCuda*:CudaMoe*' > "$OUT/test_cuda_diag.log" 2>&1
  echo "test_cuda (diag + moe) rc=$? ($((SECONDS - T0)) s)"
fi

if has route && ! late route; then
  for m in qwen3_moe deepseek_v3 minimax_m3; do
    timeout $(tmo 90) $B/tokenspeed route-diff tests/data/$m --device cuda > "$OUT/route_diff_$m.log" 2>&1
    echo "route-diff $m rc=$? ($((SECONDS - T0)) s)"
  done
fi

if has route2 && ! late route2; then
  {
    echo "### test_cuda: route / block-select hooks, block-sparse and MLA kernels"
    timeout $(tmo 60) $B/test_cuda --gtest_filter='MoeRouteHookCuda*:BlockSelectHookCuda*:CudaBlockSparse*:CudaMla*' 2>&1
    echo "test_cuda rc=$?"
    for m in qwen3_moe deepseek_v3 minimax_m3; do
      echo "### route-diff $m"
      timeout $(tmo 40) $B/tokenspeed route-diff tests/data/$m --device cuda --prompt all 2>&1
      echo "route-diff $m rc=$?"
    done
  } > "$OUT/route2.log"
  echo "route2 done ($((SECONDS - T0)) s)"
fi

if has q30 && ! late q30; then
  timeout $(tmo 150) $B/tokenspeed make-random-model --preset qwen3-30b-a3b --num-layers 8 --out /tmp/q30 > "$OUT/make_q30.log" 2>&1
  echo "make-random-model q30 rc=$? ($((SECONDS - T0)) s)"
  timeout $(tmo 120) $B/tokenspeed bench --model /tmp/q30 --device cuda --prompt-lens 1024 --batches 1,64 --contexts 1024 \
    --profile --json "$OUT/bench_q30.json" > "$OUT/bench_q30.log" 2>&1
  echo "bench q30 rc=$? ($((SECONDS - T0)) s)"
fi

if has dense && ! late dense; then
  timeout $(tmo 90) $B/tokenspeed make-random-model --preset llama-3.1-8b --num-layers 8 --out /tmp/l8b8 > "$OUT/make_l8b8.log" 2>&1
  echo "make-random-model l8b (8 layers) rc=$? ($((SECONDS - T0)) s)"
  timeout $(tmo 90) $B/tokenspeed bench --model /tmp/l8b8 --device cuda --prompt-lens 128 --batches 64,128 --contexts 1024 \
    --profile --json "$OUT/bench_l8b8.json" > "$OUT/bench_l8b8.log" 2>&1
  echo "bench l8b (8 layers) rc=$? ($((SECONDS - T0)) s)"
fi

if has q30 && [ -d /tmp/q30 ] && ! late q30-host-logits; then
  timeout $(tmo 90) $B/tokenspeed bench --model /tmp/q30 --device cuda --prompt-lens 128 --batches 1,64 --contexts 1024 \
    --host-logits > "$OUT/bench_q30_host_logits.log" 2>&1
  echo "bench q30 --host-logits rc=$? ($((SECONDS - T0)) s)"
fi

if has lab && [ -x $B/lab_moe ] && ! late lab; then
  timeout $(tmo 60) $B/lab_moe > "$OUT/lab_moe.log" 2>&1
  echo "lab_moe rc=$? ($((SECONDS - T0)) s)"
fi

# --- summary ---------------------------------------------------------------------------------
{
  echo "===== summary ($((SECONDS - T0)) s) ====="
  # route2: everything but the per-MoE-layer route table and the kernel-check rows of the forced
  # runs (their verdict line stays).
  [ -f "$OUT/route2.log" ] && awk '
    /^### / {print; skip = 0; next}
    /^\[  (PASSED|FAILED) |^\[  FAILED  \]|rc=[0-9]|rror/ {print; next}
    /^layer  tokens/ {skip = 1; next}
    skip && /^[0-9]+ / {next}
    {skip = 0}
    /^[0-9]+ +(routes|both) / {next}
    /^\[|^Note:|^Running main/ {next}
    {print}' "$OUT/route2.log"
  [ -f "$OUT/test_cuda_diag.log" ] && grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$OUT/test_cuda_diag.log"
  for m in qwen3_moe deepseek_v3 minimax_m3; do
    f="$OUT/route_diff_$m.log"
    [ -f "$f" ] || continue
    echo "--- route-diff $m"
    # per-layer table, first flip, the four logit errors, the verdict
    grep -E "^route-diff|^layer|^[0-9]+ |^first differing|^  (cpu|device|group)|^no token|^max abs|^  [a-z].* [0-9.e+-]+$|^verdict|rror" "$f"
  done
  for f in "$OUT/bench_q30.log" "$OUT/bench_l8b8.log" "$OUT/bench_q30_host_logits.log"; do
    [ -f "$f" ] || continue
    echo "--- $(basename "$f" .log)"
    # decode rows, each profile's header, its 8 costliest ops and the logits-to-host line
    awk '/^bench: (decode|prefill [0-9]+:)/ {print; next}
         /^bench: profile/ {print; n = 8; next}
         /^bench:   logits to host/ {print; next}
         n > 0 && /^bench:   / {print; n--}
         /rror/ {print}' "$f"
  done
  [ -f "$OUT/lab_moe.log" ] && { echo "--- lab_moe (64 tokens)"; grep -E "^64 " "$OUT/lab_moe.log"; }
  [ -f "$OUT/skipped.log" ] && cat "$OUT/skipped.log"
} | tee "$OUT/summary.txt"
