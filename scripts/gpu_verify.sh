#!/usr/bin/env bash
# One GPU-machine verification of a build (binaries from scripts/device_bundle.sh): every CUDA test
# suite in its own process (an abort loses only its group), verify-golden --device cuda on every
# fixture present (dense, MoE, quantized), the demo pair (greedy vs the CPU golden, EAGLE3
# acceptance, graphs vs eager) and device penalties vs the host-logits path. Prints one summary
# line per check and a SUMMARY block at the end; every log goes into $OUT/verify_logs.tgz.
# Usage: scripts/gpu_verify.sh [BIN_DIR] [STEPS]   (BIN_DIR default .device/bin, unpacked from .device/bin.tar.xz when absent; STEPS a comma list
# of tests,golden,demo,penalties; default all). TEST_FILTER narrows the test groups (a regex on the
# suite name).
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:-.device/bin}
STEPS=${2:-tests,golden,demo,penalties}
OUT=${OUT:-/tmp/out}
LOGS=/tmp/verify_logs  # tarred into $OUT at the end (few files come back from a device run)
rm -rf "$LOGS"; mkdir -p "$LOGS" "$OUT"
# BUDGET_S: seconds after which remaining checks are skipped (reported as such), so a run always
# ends with its summary inside the device command's limit.
START=$(date +%s)
left() { [ $(( $(date +%s) - START )) -lt "${BUDGET_S:-520}" ]; }
export NCCL_NVLS_ENABLE=0
[ -d "$B" ] || { [ -f .device/bin.tar.xz ] && tar -C .device -xJf .device/bin.tar.xz; }
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
has() { [[ ",$STEPS," == *",$1,"* ]]; }
summary=()
note() { echo "$*"; summary+=("$*"); }
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
if has tests; then
  # Suites one process each: the list comes from the binary itself.
  suites=$("$B/test_cuda" --gtest_list_tests | grep -E '^[A-Za-z0-9_]+\.$' | sed 's/\.$//' | sort -u)
  for s in $suites; do
    [[ -n "${TEST_FILTER:-}" && ! "$s" =~ ${TEST_FILTER} ]] && continue
    left || { note "test $s: SKIPPED (time budget)"; continue; }
    t0=$(date +%s.%N)
    timeout "${SUITE_TIMEOUT:-240}" "$B/test_cuda" --gtest_filter="$s.*" > "$LOGS/test_$s.log" 2>&1; rc=$?
    secs=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
    passed=$(grep -c '^\[       OK \]' "$LOGS/test_$s.log"); failed=$(grep -c '^\[  FAILED  \].*ms)' "$LOGS/test_$s.log")
    skipped=$(grep -c '^\[  SKIPPED \]' "$LOGS/test_$s.log")
    if [ $rc -eq 0 ]; then
      note "test $s: PASS ($passed ok, $skipped skipped, ${secs}s)"
    else
      note "test $s: FAIL rc=$rc ($passed ok, $failed failed, ${secs}s)"
      grep -E '^\[  FAILED  \]|Failure|what\(\)|Abort|error' "$LOGS/test_$s.log" | head -8
      tail -15 "$LOGS/test_$s.log"
    fi
  done
fi
if has golden; then
  for d in tests/data/*/; do
    m=$(basename "$d")
    [ -f "$d/golden.json" ] || continue
    left || { note "golden $m: SKIPPED (time budget)"; continue; }
    out=$(timeout 120 "$B/tokenspeed" verify-golden "$d" --device cuda --atol 0.1 2>&1); rc=$?
    echo "$out" > "$LOGS/golden_$m.log"
    maxd=$(echo "$out" | grep -oE 'max abs (logit )?diff[^0-9]*[0-9.e+-]+' | grep -oE '[0-9.e+-]+$' | sort -g | tail -1)
    [ $rc -eq 0 ] && note "golden $m: PASS (max abs diff ${maxd:-?})" || note "golden $m: FAIL rc=$rc (max abs diff ${maxd:-?}): $(echo "$out" | tail -1 | cut -c1-160)"
  done
fi
if has demo && left; then
  timeout 300 python3 scripts/gpu_demo_check.py "$B/tokenspeed" > "$LOGS/demo.log" 2>&1; rc=$?
  cat "$LOGS/demo.log" | tail -8
  note "demo pair rc=$rc: $(tail -1 "$LOGS/demo.log")"
fi
if has penalties && left; then
  # Device penalties (in the decode graphs, and eager) vs the host-logits path on the same GPU
  # forward (--logprobs 0 forces host logits): every greedy id must match.
  for cfg in "rep:--repetition-penalty 1.3" "all:--repetition-penalty 1.1 --presence-penalty 0.3 --frequency-penalty 0.2 --min-tokens 40"; do
    name=${cfg%%:*}; args=${cfg#*:}
    for v in "dev:" "eager:--disable-cuda-graph" "host:--logprobs 0" "simple:--disable-overlap-schedule"; do
      vn=${v%%:*}; va=${v#*:}
      # shellcheck disable=SC2086
      timeout 120 "$B/tokenspeed" generate --device cuda --prompt "def fibonacci(n):" --max-tokens 48 --print-ids $args $va \
        > "$LOGS/pen_${name}_$vn.txt" 2> "$LOGS/pen_${name}_$vn.err" || tail -3 "$LOGS/pen_${name}_$vn.err"
    done
    ok=PASS
    for vn in eager host simple; do
      cmp -s "$LOGS/pen_${name}_dev.txt" "$LOGS/pen_${name}_$vn.txt" && [ -s "$LOGS/pen_${name}_dev.txt" ] || ok="FAIL(dev vs $vn)"
    done
    note "penalties $name: device (graphs) == eager == host logits == simple loop: $ok"
  done
fi
echo "=== SUMMARY"
printf '%s\n' "${summary[@]}"
fails=$(printf '%s\n' "${summary[@]}" | grep -c 'FAIL')
echo "=== $fails failing checks"
printf '%s\n' "${summary[@]}" > "$OUT/verify_summary.txt"
tar -C /tmp -czf "$OUT/verify_logs.tgz" verify_logs
exit $((fails > 0))
