#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz; clang + ASan + UBSan, in the build-san/ of
# scripts/sanitize.sh, which instruments the whole engine once) and runs each for SECONDS seconds
# (default 30) on its seed corpus in tests/fuzz/corpus/<target>/. A crash, leak, sanitizer report or
# timeout fails the script; the reproducer is left in build-san/artifacts/.
#   scripts/fuzz.sh [SECONDS] [TARGET...]      e.g. scripts/fuzz.sh 60 protocol tokenizer
# The parsers' unit tests run under the same sanitizers in scripts/sanitize.sh (with every other
# unit and server test). New inputs the fuzzer finds go to build-san/corpus/<target>/ (not the
# repo's seed corpus).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-30}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(protocol config safetensors tokenizer chat_template http grammar)
BUILD_DIR=${SAN_BUILD_DIR:-build-san}
SAN_BUILD_DIR=$BUILD_DIR scripts/sanitize.sh --build-only "${TARGETS[@]/#/fuzz_}"
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
