#!/usr/bin/env bash
# CPU ranks through the engine (the same TP worker path as GPUs): `generate --device cpu
# --tp-size N` must give the TP 1 greedy tokens (small prefill chunks: several engine steps), and
# invalid parallel mappings must be startup errors that say why.
# Usage: parallel_test.sh BIN DATA_DIR
set -u
BIN=$1
DATA=$(cd "$2" && pwd)
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
for m in ${MODELS:-llama3 llama2_mha qwen3_moe deepseek_v3 minimax_m3 qwen3_5}; do
  check_same "$DATA/$m" --tp-size 2
done
check_same "$DATA/llama3" --tp-size 4
check_same "$DATA/qwen3_moe" --tp-size 2 --ep-size 2
check_same "$DATA/qwen3_moe" --tp-size 2 --ep-size 2 --disable-prefix-cache --max-num-seqs 1
check_same "$DATA/minimax_m3" --attn-tp-size 4 --ep-size 4
# Dense TP other than the attention TP size, and attention DP (requests of one generate run in
# group 0; the other group runs zero-token forwards beside it: the MoE collectives need it).
check_same "$DATA/llama3" --tp-size 2 --dense-tp-size 1
check_same "$DATA/llama3" --tp-size 4 --dense-tp-size 2
check_same "$DATA/deepseek_v3" --data-parallel-size 2
check_same "$DATA/deepseek_v3" --data-parallel-size 2 --ep-size 2
check_same "$DATA/deepseek_v3" --tp-size 2 --data-parallel-size 2 --ep-size 4
check_same "$DATA/deepseek_v3" --tp-size 2 --data-parallel-size 2 --dense-tp-size 4
# EAGLE3 on a TP 2 target (the draft on rank 0 rebuilds a replicated table from the vocab-parallel
# target's) gives the TP 1 tokens without EAGLE3.
check_same "$DATA/../../models/pycoder" --tp-size 2 --speculative-algorithm EAGLE3 \
  --speculative-draft-model-path "$DATA/../../models/pycoder-eagle3"

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
expect_error "needs a mixture-of-experts model" "$BIN" verify-golden "$DATA/llama3" --tp-size 2 --ep-size 2
expect_error "not divisible by the attention TP size 3" "$BIN" verify-golden "$DATA/llama3" --tp-size 3
expect_error "do not nest" "$BIN" verify-golden "$DATA/llama3" --tp-size 2 --data-parallel-size 3 --dense-tp-size 3
expect_error "intermediate_size 128 is not divisible by the dense TP size 3" "$BIN" verify-golden "$DATA/llama3" \
  --data-parallel-size 3 --dense-tp-size 3
expect_error "does not divide the world size 2" "$BIN" generate --model "$DATA/llama3" --device cpu --prompt-ids 1 \
  --tp-size 2 --dense-tp-size 4
expect_error "speculative-algorithm is not supported with attention data parallelism" "$BIN" generate \
  --model "$DATA/../../models/pycoder" --device cpu --prompt-ids 1 --data-parallel-size 2 \
  --speculative-algorithm EAGLE3 --speculative-draft-model-path "$DATA/../../models/pycoder-eagle3"
expect_error "recurrent state" "$BIN" generate --model "$DATA/qwen3_5" --device cpu --prompt-ids 1 --data-parallel-size 2
# Experts not divisible by the EP size: the fixture's config with 6 experts (checked before any
# weight is read).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in "$DATA/qwen3_moe"/*; do ln -s "$f" "$tmp/"; done
rm "$tmp/config.json"
sed -E 's/"num_local_experts": *8/"num_local_experts": 6/' "$DATA/qwen3_moe/config.json" > "$tmp/config.json"
grep -q '"num_local_experts": 6' "$tmp/config.json" || { echo "FAIL: could not make the 6-expert config"; fails=$((fails+1)); }
expect_error "6 experts are not divisible by --ep-size 4" "$BIN" verify-golden "$tmp" --tp-size 4 --ep-size 4
[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
