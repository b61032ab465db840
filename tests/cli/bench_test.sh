#!/usr/bin/env bash
# make-random-model + generate + bench on the CPU: a tiny random Llama-3.1-shaped checkpoint
# with a generated tokenizer must load, generate, and benchmark (the table prints).
set -euo pipefail
TS=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$TS" make-random-model --preset llama-3.1-8b --num-layers 2 --hidden-size 128 --intermediate-size 256 \
  --vocab-size 2048 --num-heads 4 --num-kv-heads 2 --head-dim 32 --seed 3 --out "$dir/m" | tee "$dir/make.txt"
grep -q "tokenizer generated" "$dir/make.txt" || fail "expected a generated tokenizer"
for f in config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json; do
  [ -f "$dir/m/$f" ] || fail "missing $f"
done
grep -q '"rope_type": "llama3"' "$dir/m/config.json" || fail "config.json lost the llama3 rope scaling"

ids=$("$TS" generate --model "$dir/m" --device cpu --prompt-ids 1,2,3 --max-tokens 4 --ignore-eos --print-ids)
echo "generated ids: $ids"
[[ "$ids" =~ ^\[[0-9]+,[0-9]+,[0-9]+,[0-9]+\]$ ]] || fail "expected 4 ids, got '$ids'"
"$TS" generate --model "$dir/m" --device cpu --prompt "hello world" --max-tokens 4 --ignore-eos > /dev/null

"$TS" bench --model "$dir/m" --device cpu --prompt-lens 64 --batches 1,2 --contexts 64 --decode-steps 2 \
  --json "$dir/bench.json" | tee "$dir/bench.md"
grep -q "| memory bandwidth |" "$dir/bench.md" || fail "no copy ceiling row"
grep -q "| GEMM |" "$dir/bench.md" || fail "no GEMM ceiling row"
grep -qE "^\| prefill \| 1 \| 64 \| 64 \|.*TFLOP/s \|.*% of GEMM \|" "$dir/bench.md" || fail "no prefill row"
grep -qE "^\| decode-after-prefill \| 1 \| 64 \|.*GB/s \|.*% of copy \|" "$dir/bench.md" || fail "no batch-1 decode row"
grep -qE "^\| decode \| 2 \| 64 \| 2 x 2 \|.*GB/s \|.*% of copy \|" "$dir/bench.md" || fail "no batch-2 decode row"
grep -q '"gemm_tflops"' "$dir/bench.json" || fail "no JSON"
grep -q 'greedy sampling where the logits are' "$dir/bench.md" || fail "the timed step is not described"
# --host-logits and --profile (a no-op on the CPU) run and say what they timed.
"$TS" bench --model "$dir/m" --device cpu --batches 2 --contexts 64 --decode-steps 2 --prompt-lens 16 --host-logits --profile \
  > "$dir/bench2.md"
grep -q -- '--host-logits' "$dir/bench2.md" || fail "--host-logits not reported"
grep -qE "^\| decode \| 2 \| 64 \|" "$dir/bench2.md" || fail "no decode row with --host-logits"
grep -q -- "--profile" <<< "$("$TS" bench --help)" || fail "no --profile in --help"
# --mixed-chunks: a mixed step (decodes + a prefill chunk) next to each part alone, and its ratio.
"$TS" bench --model "$dir/m" --device cpu --batches 2 --contexts 64 --decode-steps 2 --prompt-lens 16 --mixed-chunks 8,32 \
  --json "$dir/bench4.json" > "$dir/bench4.md"
grep -qE "^\| mixed \| 2 \| 64 \| 2 \+ 32 \| .* \(decode .* \+ chunk .*\) \|.*\| ratio [0-9.]+ \|" "$dir/bench4.md" ||
  fail "no mixed row for chunk 32"
python3 -c "import json,sys; r=[x for x in json.load(open(sys.argv[1]))['results'] if x['phase']=='mixed']; \
assert len(r)==2 and all(x['mixed_ms']>0 and x['decode_ms']>0 and x['chunk_ms']>0 for x in r), r" "$dir/bench4.json" ||
  fail "mixed rows in the JSON"
# --graphs: the engine's CUDA graphs (CPU: eager, not reported); --profile times eager ops only.
grep -q -- "--graphs" <<< "$("$TS" bench --help)" || fail "no --graphs in --help"
"$TS" bench --model "$dir/m" --device cpu --batches 2 --contexts 64 --decode-steps 2 --prompt-lens 16 --graphs \
  --json "$dir/bench5.json" > /dev/null || fail "--graphs on the CPU"
grep -q '"graphs": false' "$dir/bench5.json" || fail "the CPU run claims graphs"
if "$TS" bench --model "$dir/m" --device cpu --batches 2 --prompt-lens 16 --graphs --profile > "$dir/bench6.txt" 2>&1; then
  fail "--graphs --profile accepted"
fi
grep -q "without --graphs" "$dir/bench6.txt" || fail "--graphs --profile: no reason given"
# A quantized checkpoint (FP8 block-128): generates, and bench reports the bytes a step reads as stored.
"$TS" make-random-model --preset llama-3.1-8b --quant fp8 --num-layers 2 --hidden-size 128 --intermediate-size 256 \
  --vocab-size 2048 --num-heads 4 --num-kv-heads 2 --head-dim 32 --seed 3 --out "$dir/q" > /dev/null
grep -q '"quant_method": "fp8"' "$dir/q/config.json" || fail "no quantization_config"
"$TS" generate --model "$dir/q" --device cpu --prompt-ids 1,2,3 --max-tokens 4 --ignore-eos --print-ids > /dev/null
"$TS" bench --model "$dir/q" --device cpu --batches 1 --contexts 64 --decode-steps 2 --prompt-lens 16 > "$dir/bench3.md"
grep -q "quantized checkpoint (fp8): a batch-1 decode step reads" "$dir/bench3.md" || fail "no stored-bytes line"
grep -q -- "--quant" <<< "$("$TS" make-random-model --help)" || fail "no --quant in --help"
echo PASS
