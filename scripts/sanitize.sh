#!/usr/bin/env bash
# The engine built once with clang + ASan + UBSan (build-san/, CPU only, recovery off; the libFuzzer
# targets of scripts/fuzz.sh come from the same build) running the unit tests and the server tests
# — hostile clients included (tests/server/frontdoor, shutdown, hostile_json) — against the
# instrumented binary. -O1 -g1: a CI-sized build (line tables are all ASan reports need). A memory
# error, leak or undefined behaviour anywhere fails the script. CI runs it after the fuzzers (.ci/run).
#   scripts/sanitize.sh [REGEX]                 build everything, run the unit + server tests (ctest -R REGEX)
#   scripts/sanitize.sh --build-only [TARGET...]  configure and build (all targets, or the named ones)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${SAN_BUILD_DIR:-build-san}
scripts/setup.sh --fuzz
# Compiler-cache paths relative to the checkout's parent, as in scripts/build.sh (clones share hits).
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(cd .. && pwd)} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  LAUNCHER=()
  command -v ccache > /dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  mkdir -p "$BUILD_DIR"
  CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" -DTS_CUDA=OFF -DTS_FUZZ=ON \
    "${LAUNCHER[@]}" > "$BUILD_DIR/configure.log" 2>&1 || { cat "$BUILD_DIR/configure.log"; exit 1; }
fi
if [ "${1:-}" = "--build-only" ]; then
  shift
  targets=()
  [ $# -gt 0 ] && targets=(--target "$@")
  exec cmake --build "$BUILD_DIR" "${targets[@]}" -j "${JOBS:-$(nproc)}"
fi
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}"
# Leaks are checked at exit of every test process; the quarantine is kept small so the server
# tests' RSS bounds still mean something.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:quarantine_size_mb=16:abort_on_error=0:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# The server tests scale their wall-clock bounds by this (tests/server/lib.mjs): the point here is
# memory errors, and the sanitizers slow the engine 2-5x.
export TS_SANITIZED=1
# Goldens and benches are compute (the normal build runs them); wall-clock bounds (*IsFast*, *HostTime*, the
# slow label) do not hold at the sanitizers' 2-5x slowdown.
cd "$BUILD_DIR"
args=(-L 'unit|server' -LE 'cuda|slow' -E 'IsFast|HostTime' --output-on-failure -j "${JOBS:-$(nproc)}" --timeout 900)
[ $# -gt 0 ] && args+=(-R "$1")
ctest "${args[@]}"
