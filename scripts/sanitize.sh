#!/usr/bin/env bash
# The engine built with ASan + UBSan (build-asan/, CPU only) running the unit tests and the server
# tests — hostile clients included (tests/server/frontdoor, shutdown) — against the instrumented
# binary. -O1 -g1: a CI-sized build (line tables are all ASan reports need). A memory error, leak or undefined behaviour anywhere fails the script. CI calls it after
# the fuzzers (.ci/run). Usage: scripts/sanitize.sh [ctest -R regex]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${SAN_BUILD_DIR:-build-asan}
LAUNCHER=()
command -v ccache > /dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  mkdir -p "$BUILD_DIR"
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" -DTS_CUDA=OFF -DTS_SANITIZE=ON \
    "${LAUNCHER[@]}" > "$BUILD_DIR/configure.log" 2>&1 || { cat "$BUILD_DIR/configure.log"; exit 1; }
fi
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}"
# Leaks are checked at exit of every test process; the quarantine is kept small so the server
# tests' RSS bounds still mean something.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:quarantine_size_mb=16:abort_on_error=0:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TS_SANITIZED=1
# Goldens and benches are compute (the normal build runs them); wall-clock bounds (*IsFast*, *HostTime*, the
# slow label) do not hold at the sanitizers' 2-5x slowdown.
cd "$BUILD_DIR"
args=(-L 'unit|server' -LE 'cuda|slow' -E 'IsFast|HostTime' --output-on-failure -j "${JOBS:-$(nproc)}" --timeout 900)
[ $# -gt 0 ] && args+=(-R "$1")
ctest "${args[@]}"
