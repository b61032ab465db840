#!/usr/bin/env bash
# route-diff on the CPU against itself: no routing differs, and forcing the CPU's routing gives
# the same logit error as not forcing it (the same fp32 arithmetic).
set -euo pipefail
TS=$1
DATA=$2
fail() { echo "FAIL: $*" >&2; exit 1; }
for m in qwen3_moe deepseek_v3; do
  out=$("$TS" route-diff "$DATA/$m" --device cpu)
  echo "$out"
  echo "$out" | grep -q "prompt 3 (743 tokens)" || fail "$m: the default prompt is not the longest"
  echo "$out" | grep -q "no token's expert set differs" || fail "$m: the cpu differs from itself"
  free=$(echo "$out" | awk '$1 == "cpu" && NF == 2 {print $2}')
  forced=$(echo "$out" | awk '/cpu, cpu routing forced/ {print $NF}')
  [ -n "$free" ] && [ -n "$forced" ] || fail "$m: no logit diff lines"
  [ "$free" = "$forced" ] || fail "$m: forced $forced != free $free"
done
"$TS" route-diff "$DATA/llama3" --device cpu > /dev/null 2>&1 && fail "a dense model must be refused"
grep -q -- "--prompt" <<< "$("$TS" route-diff --help)" || fail "no --prompt in --help"
echo PASS
