#!/usr/bin/env bash
# The parallel mappings of one golden fixture on CPU ranks (threads over the CPU Comm backend,
# the engine's TP worker path): `verify-golden FIXTURE --device cpu <mapping>` must match the
# transformers goldens like TP 1 does, for every mapping that is valid for the fixture:
#   every fixture   TP 2; attention TP 2 with dense TP 1 (dense MLPs whole on every rank);
#                   attention DP 2 (two groups of one rank, prompts alternating between them);
#                   TP 2 x DP 2 with dense TP 4 (dense MLPs over both groups: tokens gathered)
#   MoE fixtures    attention TP 2 + MoE EP 2 (--ep-size and --enable-expert-parallel); TP 4 with
#                   MoE TP 2 (a sub-group); DP 2 with MoE TP over the world (tokens gathered) and
#                   with EP 2 (dispatch / combine), TP 2 x DP 2 with EP 4 (dispatch of each
#                   attention group's token slices)
# Recurrent (hybrid) models have no attention DP. PROMPTS (optional): a --prompts subset for the
# mappings past TP 2 (the 743-token prompts cost the most).
# Usage: parallel_matrix_test.sh BIN FIXTURE_DIR
set -u
BIN=$1
FIX=$2
name=$(basename "$FIX")
fails=0
runs=0

run() {  # run FLAGS...: one mapping against the goldens
  local out rc
  out=$("$BIN" verify-golden "$FIX" --device cpu "$@" 2>&1)
  rc=$?
  runs=$((runs + 1))
  if [ $rc -eq 0 ] && echo "$out" | tail -1 | grep -q "PASS"; then
    echo "ok: $name $* ($(echo "$out" | tail -1 | grep -o 'max abs logit diff [^ ]*'))"
  else
    echo "FAIL (rc=$rc): $name $*"
    echo "$out" | tail -6
    fails=$((fails + 1))
  fi
}

cfg="$FIX/config.json"
moe=0
grep -Eq '"(num_experts|n_routed_experts|num_local_experts)": *[1-9]' "$cfg" && moe=1
hybrid=0
grep -q '"linear_attention"' "$cfg" && hybrid=1
sub=()
[ -n "${PROMPTS:-}" ] && sub=(--prompts "$PROMPTS")

run --tp-size 2
run --tp-size 2 --dense-tp-size 1 "${sub[@]}"
if [ $hybrid -eq 0 ]; then
  run --data-parallel-size 2 "${sub[@]}"
  run --tp-size 2 --data-parallel-size 2 --dense-tp-size 4 "${sub[@]}"
fi
if [ $moe -eq 1 ]; then
  run --tp-size 2 --ep-size 2 "${sub[@]}"
  run --attn-tp-size 2 --enable-expert-parallel "${sub[@]}"
  run --tp-size 4 --moe-tp-size 2 "${sub[@]}"
  run --data-parallel-size 2 --ep-size 2 "${sub[@]}"
  run --tp-size 2 --data-parallel-size 2 --ep-size 4 "${sub[@]}"
fi
echo "$name: $runs mappings, $fails failure(s)"
[ $fails -eq 0 ]
