#!/usr/bin/env bash
# Runs ON the GPU machine from the repo root, with binaries prebuilt elsewhere (no rebuild here):
#   scripts/gpu_check.sh [build-dir]     (default: build)
# nvidia-smi, the CUDA tests (ctest -L cuda, or the test binary directly when ctest is missing),
# then every kernel lab. Everything is tee'd to "${OUT:-/tmp}/gpu_check.log".
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
LOG="${OUT:-/tmp}/gpu_check.log"
mkdir -p "$(dirname "$LOG")"
: > "$LOG"
status=0
run() {
  echo "=== $* ===" | tee -a "$LOG"
  "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  echo "=== exit $rc: $* ===" | tee -a "$LOG"
  [ "$rc" = 0 ] || status=1
}
run nvidia-smi
# ctest's files hold absolute paths of the machine that configured the build: use them only if
# they point at this build dir; otherwise run the gtest binary itself (same tests).
ABS_BUILD=$(cd "$BUILD_DIR" && pwd)
if command -v ctest >/dev/null 2>&1 && grep -q "$ABS_BUILD/test_cuda" "$BUILD_DIR/CTestTestfile.cmake" 2>/dev/null; then
  run ctest --test-dir "$BUILD_DIR" -L cuda --output-on-failure --timeout 1800
else
  run "$BUILD_DIR/test_cuda"
fi
for lab in "$BUILD_DIR"/lab_*; do
  [ -x "$lab" ] && run "$lab"
done
echo "gpu_check: status $status, log in $LOG" | tee -a "$LOG"
exit $status
