#!/usr/bin/env bash
# CPU ranks through the engine (the same TP worker path as GPUs): `generate --device cpu
# --tp-size N` must give the TP 1 greedy tokens (small prefill chunks: several engine steps), and
# invalid parallel mappings must be startup errors that say why.
# Usage: parallel_test.sh BIN DATA_DIR
set -u
BIN=$1
DATA=$2
fails=0

gen() {  # gen MODEL FLAGS... -> the generated ids
  local model=$1; shift
  "$BIN" generate --model "$model" --device cpu --prompt-ids 1,2,3,4,5,6,7 --max-tokens 8 --ignore-eos --print-ids \
    --chunked-prefill-size 3 "$@" 2>/dev/null
}
check_same() {  # check_same MODEL FLAGS...
  local model=$1; shift
  local want got
  want=$(gen "$model")
  got=$(gen "$model" "$@")
  if [ -n "$want" ] && [ "$want" = "$got" ]; then echo "ok: $(basename "$model") $* = tp 1 $want"
  else echo "FAIL: $(basename "$model") $*: got '$got', want '$want'"; fails=$((fails+1)); fi
}
for m in ${MODELS:-llama3 llama2_mha qwen3_moe}; do
  check_same "$DATA/$m" --tp-size 2
done
check_same "$DATA/llama3" --tp-size 4
check_same "$DATA/qwen3_moe" --tp-size 2 --ep-size 2
check_same "$DATA/qwen3_moe" --tp-size 2 --ep-size 2 --disable-prefix-cache --max-num-seqs 1

expect_error() {  # expect_error "pattern" cmd...
  local pat=$1; shift
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ $rc -eq 0 ] || [ $rc -ge 128 ] || ! echo "$out" | grep -q -- "$pat"; then
    echo "FAIL (rc=$rc, want '$pat'): $*"; echo "$out" | tail -3; fails=$((fails+1)); return
  fi
  echo "ok: $pat"
}
expect_error "disagree" "$BIN" verify-golden "$DATA/llama3" --tp-size 2 --attn-tp-size 4
expect_error "does not divide the world size 2" "$BIN" verify-golden "$DATA/llama3" --tp-size 2 --ep-size 3
expect_error "cannot both be > 1" "$BIN" generate --model "$DATA/llama3" --device cpu --prompt-ids 1 --tp-size 4 \
  --moe-tp-size 2 --ep-size 2
[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
