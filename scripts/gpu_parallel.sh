#!/usr/bin/env bash
# GPU checks of the parallel layers (issue #20). Usage: scripts/gpu_parallel.sh BUILD_DIR
#  - 1 GPU: TP 1 paths unchanged (the CUDA goldens of every fixture) and the CUDA unit tests of
#    the parallel pieces (tp / comm / graph tests skip what needs 2 GPUs);
#  - 2+ GPUs: verify-golden at TP 2 for the dense, MoE (MoE TP and EP) and MLA fixtures, and
#    generate at TP 2 against TP 1 (greedy ids; bf16 near-ties may differ, reported, not fatal).
set -u
B=${1:-build}
BIN=$B/tokenspeed
D=$(cd "$(dirname "$0")/.." && pwd)/tests/data
fails=0
run() {  # run NAME CMD...
  local name=$1; shift
  if "$@" > "/tmp/gpu_parallel_$name.log" 2>&1; then echo "ok:   $name ($(tail -1 "/tmp/gpu_parallel_$name.log"))"
  else echo "FAIL: $name"; tail -5 "/tmp/gpu_parallel_$name.log"; fails=$((fails+1)); fi
}
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
echo "GPUs: $ngpu"
for f in llama3 qwen3 qwen3_moe deepseek_v3 minimax_m3 llama3_fp8 qwen3_moe_fp8; do
  run "tp1_$f" "$BIN" verify-golden "$D/$f" --device cuda --atol 0.1
done
if [ -x "$B/test_cuda" ]; then
  run test_cuda_parallel "$B/test_cuda" --gtest_filter='*Tp*:*Comm*:*Nccl*:*Ep*:*Dispatch*:*Graph*'
fi
if [ "$ngpu" -ge 2 ]; then
  for f in llama3 qwen3 qwen3_moe deepseek_v3 llama3_fp8 qwen3_moe_fp8; do
    run "tp2_$f" "$BIN" verify-golden "$D/$f" --device cuda --tp-size 2 --atol 0.1
  done
  for f in qwen3_moe deepseek_v3; do
    run "tp2_ep2_$f" "$BIN" verify-golden "$D/$f" --device cuda --tp-size 2 --ep-size 2 --atol 0.1
  done
  for f in llama3 qwen3_moe; do
    a=$("$BIN" generate --model "$D/$f" --device cuda --prompt-ids 1,2,3,4,5,6,7 --max-tokens 16 --ignore-eos --print-ids 2>/dev/null)
    b=$("$BIN" generate --model "$D/$f" --device cuda --tp-size 2 --prompt-ids 1,2,3,4,5,6,7 --max-tokens 16 --ignore-eos \
      --print-ids 2>/dev/null)
    echo "generate $f: tp1 $a / tp2 $b $([ "$a" = "$b" ] && echo same || echo DIFFERENT)"
  done
fi
[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all passed"
