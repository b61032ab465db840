#!/usr/bin/env bash
# One GPU-machine session with prebuilt binaries (scripts/device_bundle.sh): CUDA op tests,
# kernel labs, goldens on the GPU, the demo pair on the GPU, and the Llama-3.1-8B-shaped bench.
# Logs go to $OUT. Steps: a comma list of tests,labs,golden,demo,graphs,bench8b,peer,moe30b,minimax (default all
# but peer). peer: `tokenspeed bench --json` and the transformers peer (bench/peers/hf_peer.py) on the same
# random Llama-3.1-8B checkpoint in the same run, then the ratios (bench/peers/compare.py).
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
B=.device/bin
[ -d $B ] || tar -C .device -xJf .device/bin.tar.xz
OUT=${OUT:-/tmp/out}
STEPS=${1:-tests,labs,golden,demo,graphs,bench8b,moe30b,minimax}
has() { [[ ",$STEPS," == *",$1,"* ]]; }
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm --format=csv,noheader
if has tests; then
  timeout ${TEST_TIMEOUT:-240} $B/test_cuda > $OUT/test_cuda.log 2>&1; echo "test_cuda rc=$?"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests ran" $OUT/test_cuda.log | head -20
fi
if has labs; then
  for l in ${LABS:-$B/lab_*}; do timeout 120 $l > $OUT/$(basename $l).log 2>&1; echo "$(basename $l) rc=$?"; done
fi
if has golden; then
  for m in llama3 llama2_mha qwen3 qwen3_moe deepseek_v3 minimax_m3; do
    timeout 60 $B/tokenspeed verify-golden tests/data/$m --device cuda --atol 0.1 2>&1 | tail -3
  done 2>&1 | tee $OUT/golden.log
fi
if has demo; then
  python3 scripts/gpu_demo_check.py $B/tokenspeed 2>&1 | tee $OUT/demo.log
  timeout 60 $B/tokenspeed bench-decode --device cuda --prompt-tokens 512 --gen-tokens 256 2>&1 | tail -3 | tee -a $OUT/demo.log
fi
if has graphs; then
  timeout 120 $B/tokenspeed bench-decode --device cuda --graphs --prompt-tokens 512 --gen-tokens 128 2>&1 | grep -v "^\[[0-9]" | tee $OUT/graphs_demo.log
fi
if has bench8b; then
  timeout 120 $B/tokenspeed make-random-model --preset llama-3.1-8b --out /tmp/l8b > /tmp/make8b.log 2>&1; echo "make-random-model rc=$?"
  timeout 300 $B/tokenspeed bench --model /tmp/l8b --device cuda > $OUT/bench8b.log 2>&1; echo "bench rc=$?"
  grep -v "^\[" $OUT/bench8b.log | tail -30
  timeout 240 $B/tokenspeed bench-decode --model /tmp/l8b --device cuda --graphs --prompt-tokens 1024 --gen-tokens 64 \
    --cached-prefix 32768 --new-tokens 64,256,800,2048 2>&1 | grep -v "^\[[0-9]" | tee $OUT/graphs_8b.log
fi
if has peer; then
  [ -f /tmp/l8b/config.json ] || { timeout 120 $B/tokenspeed make-random-model --preset llama-3.1-8b --out /tmp/l8b > /tmp/make8b.log 2>&1; echo "make-random-model rc=$?"; }
  timeout 240 $B/tokenspeed bench --model /tmp/l8b --device cuda --prompt-lens ${PEER_PROMPTS:-8192} --batches 1,64 \
    --contexts 1024 --json $OUT/ours8b.json > $OUT/bench8b_peer.log 2>&1; echo "bench rc=$?"
  PYTHONUNBUFFERED=1 timeout ${PEER_TIMEOUT:-360} python3 bench/peers/hf_peer.py --model /tmp/l8b --prompt-lens ${PEER_PROMPTS:-8192} \
    --batches 1,64 --contexts 1024 --cached-prefix 32768 --new-tokens 64,2048 --json $OUT/peer8b.json 2>&1 | tee $OUT/peer8b.log
  python3 bench/peers/compare.py $OUT/ours8b.json $OUT/peer8b.json 2>&1 | tee $OUT/compare8b.md
fi
if has moe30b; then
  # Qwen3-30B-A3B shapes (8 of 48 layers: real per-layer MoE traffic, smaller checkpoint).
  timeout 180 $B/tokenspeed make-random-model --preset qwen3-30b-a3b --num-layers 8 --out /tmp/q30 > $OUT/make30b.log 2>&1; echo "make-random-model rc=$?"
  timeout 240 $B/tokenspeed bench-decode --model /tmp/q30 --device cuda --graphs --prompt-tokens 512 --gen-tokens 64 2>&1 \
    | grep -v "^\[[0-9]" | tee $OUT/moe30b.log
  timeout 200 $B/tokenspeed bench --model /tmp/q30 --device cuda --prompt-lens 1024 --batches 1,64 --contexts 1024 \
    > $OUT/bench_q30.log 2>&1; echo "bench q30 rc=$?"; grep -v "^\[" $OUT/bench_q30.log | tail -16
fi
if has minimax; then
  python3 - <<'PY' > /tmp/minimax_src.log 2>&1
import os, shutil, pkgutil, transformers.models as tm
names = [m.name for m in pkgutil.iter_modules(tm.__path__) if 'minimax' in m.name]
print(names)
os.makedirs(os.environ.get('OUT', '/tmp') + '/mm', exist_ok=True)
for n in names:
    d = os.path.join(tm.__path__[0], n)
    for f in os.listdir(d):
        if f.startswith('modeling') or f.startswith('modular'):
            shutil.copy(os.path.join(d, f), os.environ.get('OUT', '/tmp') + '/mm/' + n + '__' + f)
            print('copied', n, f)
PY
  tail -3 /tmp/minimax_src.log; (cd $OUT && tar czf mm.tgz mm && rm -rf mm)
fi
