#!/usr/bin/env bash
# Structured outputs on the GPU (#18 item 2): the token-bitmask kernel against the CPU op (also
# replayed from a captured CUDA graph), sample_batch's device path for grammar requests, then the
# structured-output server tests (openai .parse + zod, AI SDK, LangChain, tool_choice) with the
# server on --device cuda. Usage: scripts/gpu_structured.sh BUILD_DIR (a CUDA build with
# tokenspeed and test_cuda; tests/server/node_modules installed). Logs go to $OUT (default /tmp/out).
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:?usage: scripts/gpu_structured.sh BUILD_DIR}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
rc=0
if [ -x "$B/test_cuda" ]; then
  timeout 300 "$B/test_cuda" --gtest_filter='CudaBitmask.*' > "$OUT/test_cuda_bitmask.log" 2>&1
  r=$?; echo "test_cuda CudaBitmask.* rc=$r"; grep -E "OK|PASSED|FAILED|SKIP" "$OUT/test_cuda_bitmask.log" | tail -8
  [ $r -eq 0 ] || rc=1
else
  echo "no $B/test_cuda: build it with: cmake --build $B --target test_cuda"; rc=1
fi
if command -v node > /dev/null && [ -d tests/server/node_modules ]; then
  TS_TEST_DEVICE=cuda TOKENSPEED_BIN="$B/tokenspeed" timeout 600 node --test tests/server/structured.test.mjs \
    > "$OUT/server_structured_cuda.log" 2>&1
  r=$?; echo "server structured.test.mjs on --device cuda rc=$r"; grep -E "^# (pass|fail)|^not ok" "$OUT/server_structured_cuda.log"
  [ $r -eq 0 ] || rc=1
else
  echo "node or tests/server/node_modules missing: (cd tests/server && npm install)"; rc=1
fi
exit $rc
