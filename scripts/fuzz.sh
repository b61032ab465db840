#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang + ASan + UBSan) in build-fuzz/ and runs each for
# SECONDS seconds (default 30) on its seed corpus in tests/fuzz/corpus/<target>/. A crash, leak,
# sanitizer report or timeout fails the script; the reproducer is left in build-fuzz/artifacts/.
#   scripts/fuzz.sh [SECONDS] [TARGET...]      e.g. scripts/fuzz.sh 60 protocol tokenizer
# With no TARGET (as CI calls it) it also builds and runs san_unit_tests: the unit tests of the
# same parsers under the same ASan + UBSan instrumentation.
# New inputs the fuzzer finds go to build-fuzz/corpus/<target>/ (not the repo's seed corpus).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-30}
shift || true
TARGETS=("$@")
SAN_TESTS=0
[ ${#TARGETS[@]} -gt 0 ] || SAN_TESTS=1
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(protocol config safetensors tokenizer chat_template http grammar)
BUILD_DIR=${FUZZ_BUILD_DIR:-build-fuzz}
scripts/setup.sh --fuzz
LAUNCHER=()
command -v ccache > /dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  mkdir -p "$BUILD_DIR"
  CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTS_CUDA=OFF \
    -DTS_FUZZ=ON "${LAUNCHER[@]}" > "$BUILD_DIR/configure.log" 2>&1 || { cat "$BUILD_DIR/configure.log"; exit 1; }
fi
BUILD_TARGETS=("${TARGETS[@]/#/fuzz_}")
[ $SAN_TESTS = 1 ] && BUILD_TARGETS+=(san_unit_tests)
cmake --build "$BUILD_DIR" --target "${BUILD_TARGETS[@]}" -j "${JOBS:-$(nproc)}"
mkdir -p "$BUILD_DIR/artifacts"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
for t in "${TARGETS[@]}"; do
  seeds=(tests/fuzz/corpus/$t)
  # Real inputs already in the repository seed the fuzzers too (not copied into the corpus).
  max_len=65536
  case $t in
    tokenizer) seeds+=(tests/data/tokenizers/bytelevel-1k tests/data/tokenizers/metaspace-1k); max_len=131072 ;;
    chat_template) [ -d shared/chat_templates ] && seeds+=(shared/chat_templates) ;;
  esac
  work=$BUILD_DIR/corpus/$t
  mkdir -p "$work"
  echo "== fuzz_$t: ${SECS}s"
  # -rss_limit_mb / -malloc_limit_mb: an input that makes the loader allocate gigabytes is a
  # finding too; -timeout: one input taking more than 10 s is a hang.
  if ! "$BUILD_DIR/fuzz_$t" "$work" "${seeds[@]}" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 \
      -malloc_limit_mb=1024 -max_len=$max_len -print_final_stats=1 -artifact_prefix="$BUILD_DIR/artifacts/$t-" \
      > "$BUILD_DIR/fuzz_$t.log" 2>&1; then
    tail -40 "$BUILD_DIR/fuzz_$t.log"
    failed+=("$t")
  else
    grep -E "stat::number_of_executed_units|cov:" "$BUILD_DIR/fuzz_$t.log" | tail -2
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]} (reproducers in $BUILD_DIR/artifacts/)"
  exit 1
fi
echo "fuzz: all ${#TARGETS[@]} targets ran ${SECS}s without findings"
if [ $SAN_TESTS = 1 ]; then
  echo "== san_unit_tests (ASan + UBSan)"
  # The tests open fixtures by path relative to the checkout.
  # Wall-clock bounds (*IsFast*) do not hold under the sanitizers' slowdown: those tests run in the normal build.
  if ! "$BUILD_DIR/san_unit_tests" --gtest_brief=1 --gtest_filter='-*IsFast*' > "$BUILD_DIR/san_unit_tests.log" 2>&1; then
    tail -60 "$BUILD_DIR/san_unit_tests.log"
    echo "fuzz: san_unit_tests FAILED (log: $BUILD_DIR/san_unit_tests.log)"
    exit 1
  fi
  tail -3 "$BUILD_DIR/san_unit_tests.log"
fi
