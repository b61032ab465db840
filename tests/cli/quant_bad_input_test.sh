#!/usr/bin/env bash
# Quantized checkpoints with bad input must fail at startup, naming the file and the tensor:
# an unknown quant_method / quant_algo (listing the supported ones), a quantized tensor in a module
# the config excludes, a missing scale, a mis-shaped scale.
set -euo pipefail
TS=$1
DATA=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
expect_error() {  # model dir, then substrings the error must contain
  local m=$1; shift
  if out=$("$TS" verify-golden "$m" 2>&1); then fail "$m: expected a startup error, got: $out"; fi
  for s in "$@"; do
    grep -qF -- "$s" <<< "$out" || fail "$m: error lacks '$s': $out"
  done
  echo "ok: $(tail -1 <<< "$out")"
}
edit_json() {  # file, python statement on `c`
  python3 - "$1" "$2" <<'PY'
import json, sys
p, stmt = sys.argv[1], sys.argv[2]
c = json.load(open(p))
exec(stmt)
json.dump(c, open(p, "w"))
PY
}
# Rewrites model.safetensors: drop tensor A, or give tensor A the shape of tensor B's bytes.
edit_st() {  # file, python statement on `h` (the header dict)
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
p, stmt = sys.argv[1], sys.argv[2]
b = open(p, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
exec(stmt)
# Repack the data section so it stays valid safetensors (no holes: a deleted tensor's bytes go
# too; offsets keep their order and alignment) and only the edit itself is wrong.
data, out = b[8 + n:], b""
for k, v in sorted(((k, v) for k, v in h.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"][0]):
    a, e = v["data_offsets"]
    v["data_offsets"] = [len(out), len(out) + (e - a)]
    out += data[a:e]
s = json.dumps(h).encode()
s += b" " * ((8 - (len(s) + 8) % 8) % 8)
open(p, "wb").write(struct.pack("<Q", len(s)) + s + out)
PY
}

cp -r "$DATA/llama3_fp8" "$dir/method"
edit_json "$dir/method/config.json" "c['quantization_config']['quant_method'] = 'gptq'"
expect_error "$dir/method" "$dir/method/config.json" "gptq" "supported: fp8, compressed-tensors, fbgemm_fp8, modelopt"

cp -r "$DATA/llama3_nvfp4" "$dir/algo"
edit_json "$dir/algo/hf_quant_config.json" "c['quantization']['quant_algo'] = 'W4A8_AWQ'"
expect_error "$dir/algo" "hf_quant_config.json" "W4A8_AWQ" "FP8_PER_CHANNEL_PER_TOKEN, MIXED_PRECISION"

cp -r "$DATA/qwen3_fp8ch" "$dir/ignored"
edit_json "$dir/ignored/config.json" "c['quantization_config']['ignore'] = ['lm_head', 're:.*layers[.]1[.]mlp[.].*']"
expect_error "$dir/ignored" "$dir/ignored/model.safetensors" "model.layers.1.mlp." "excluded" "re:.*layers"

cp -r "$DATA/qwen3_moe_nvfp4" "$dir/excluded"
edit_json "$dir/excluded/hf_quant_config.json" "c['quantization']['exclude_modules'].append('model.layers.*.self_attn.o_proj')"
expect_error "$dir/excluded" "model.safetensors" "self_attn.o_proj.weight" "exclude_modules entry 'model.layers.*.self_attn.o_proj'"

cp -r "$DATA/llama3_fp8" "$dir/noscale"
edit_st "$dir/noscale/model.safetensors" "del h['model.layers.0.self_attn.q_proj.weight_scale_inv']"
expect_error "$dir/noscale" "$dir/noscale/model.safetensors" "model.layers.0.self_attn.q_proj.weight" "no scale"

cp -r "$DATA/deepseek_v3_fp8" "$dir/shape"
# kv_a_proj_with_mqa [160, 256] has a [2, 2] grid; claim [4, 1] (same bytes).
edit_st "$dir/shape/model.safetensors" "h['model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv']['shape'] = [4, 1]"
expect_error "$dir/shape" "$dir/shape/model.safetensors" "kv_a_proj_with_mqa.weight_scale_inv" "[4, 1]" "expected [2, 2]"
# --simulate-w8a8 is the CPU's oracle of CUDA's W8A8: listed in --help, refused on CUDA, and on a
# fixture whose K (256) keeps CUDA weight-only it changes nothing (the golden still matches).
grep -q -- "--simulate-w8a8" <<< "$("$TS" verify-golden --help)" || fail "no --simulate-w8a8 in --help"
if out=$("$TS" verify-golden "$DATA/llama3_fp8" --simulate-w8a8 --device cuda 2>&1); then fail "--simulate-w8a8 on cuda accepted"; fi
grep -q "for the CPU backend" <<< "$out" || fail "--simulate-w8a8 --device cuda: $out"
"$TS" verify-golden "$DATA/llama3_fp8" --simulate-w8a8 > /dev/null || fail "--simulate-w8a8 on a K=256 fixture"
echo PASS
