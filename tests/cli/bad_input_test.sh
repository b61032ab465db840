#!/usr/bin/env bash
# Bad input to the CLI: each case must fail with exit code != 0 and a one-line error that names
# the problem — never a crash (signal) or a silent success.
set -u
BIN=$1
SRC=$(cd "$(dirname "$0")/../.." && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
expect_error() {  # expect_error "pattern" cmd...
  local pat=$1; shift
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ $rc -eq 0 ] || [ $rc -ge 128 ]; then
    echo "FAIL (rc=$rc): $*"; echo "$out" | tail -3; fails=$((fails+1)); return
  fi
  if ! echo "$out" | grep -q -- "$pat"; then
    echo "FAIL (message lacks '$pat'): $*"; echo "$out" | tail -3; fails=$((fails+1)); return
  fi
  echo "ok: $pat"
}
M=$SRC/tests/data/llama3
# --kv-cache-dtype: an unknown type, and FP8 on a model with an indexer (auxiliary) cache.
expect_error "--kv-cache-dtype 'fp4' is not supported" "$BIN" generate --model "$M" --device cpu --kv-cache-dtype fp4 --prompt-ids 1,2
expect_error "auxiliary (indexer) or recurrent" "$BIN" generate --model "$SRC/tests/data/minimax_m3" --device cpu --kv-cache-dtype fp8 --prompt-ids 1,2
# --bad-words: a whitespace-only word names the field.
expect_error "bad_words" "$BIN" generate --model "$M" --device cpu --prompt-ids 1,2 --bad-words " "
# Missing model directory.
expect_error "does not exist" "$BIN" generate --model "$T/nope" --prompt-ids 1,2
# A directory that is not a model (no config.json).
mkdir -p "$T/empty"
expect_error "config.json" "$BIN" generate --model "$T/empty" --prompt-ids 1,2
# Corrupt safetensors header / truncated file / wrong tensor shape, each naming the file.
cp -r "$M" "$T/bad"
printf '\x10\x00\x00\x00\x00\x00\x00\x00{not json}......' > "$T/bad/model.safetensors"
expect_error "bad safetensors header" "$BIN" verify-golden "$T/bad"
cp "$M/model.safetensors" "$T/bad/model.safetensors"
truncate -s 4000 "$T/bad/model.safetensors"
expect_error "truncated" "$BIN" verify-golden "$T/bad"
cp "$M/model.safetensors" "$T/bad/model.safetensors"
python3 - "$T/bad/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["intermediate_size"] = 100; json.dump(c, open(sys.argv[1], "w"))
PY
expect_error "mlp.gate_proj.weight has shape" "$BIN" verify-golden "$T/bad"
# A config the engine cannot serve: unknown architecture, unknown rope type.
cp "$M/config.json" "$T/bad/config.json"
python3 - "$T/bad/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["architectures"] = ["FancyNewForCausalLM"]; json.dump(c, open(sys.argv[1], "w"))
PY
expect_error "unsupported architecture FancyNewForCausalLM" "$BIN" verify-golden "$T/bad"
python3 - "$T/bad/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["architectures"] = ["LlamaForCausalLM"]; c["rope_scaling"]["rope_type"] = "longrope"; json.dump(c, open(sys.argv[1], "w"))
PY
expect_error "rope type" "$BIN" verify-golden "$T/bad"
# Issue #23: config values that used to crash (SIGFPE, SIGSEGV), load silently or fail only at the
# first forward. Each must fail at load naming the file and the field.
edit() {  # edit DIR FILE 'python statement on c'
  python3 - "$1/$2" "$3" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); exec(sys.argv[2]); json.dump(c, open(sys.argv[1], "w"))
PY
}
fresh() { rm -rf "$T/$1"; cp -r "$SRC/tests/data/$2" "$T/$1"; }
fresh cfg llama3
edit "$T/cfg" config.json 'c["num_attention_heads"] = 0'
expect_error "config.json: field num_attention_heads = 0" "$BIN" verify-golden "$T/cfg"
fresh cfg llama3
edit "$T/cfg" config.json 'c["max_position_embeddings"] = 2**58'
expect_error "config.json: field max_position_embeddings" "$BIN" verify-golden "$T/cfg"
fresh cfg llama3
edit "$T/cfg" config.json 'c["rms_norm_eps"] = -1'
expect_error "config.json: field rms_norm_eps" "$BIN" verify-golden "$T/cfg"
fresh cfg llama3
edit "$T/cfg" config.json 'c["rope_theta"] = 0; c.get("rope_scaling", {}).pop("rope_theta", None)'
expect_error "config.json: field rope_theta" "$BIN" verify-golden "$T/cfg"
fresh cfg llama3
python3 - "$T/cfg/config.json" <<'PY'
import sys
p = sys.argv[1]; s = open(p).read(); open(p, "w").write(s.replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": 1e400').replace('"rms_norm_eps": 1e-6', '"rms_norm_eps": 1e400'))
PY
grep -q 1e400 "$T/cfg/config.json" || echo '{"x": 1e400}' > "$T/cfg/config.json"
expect_error "config.json: invalid JSON: number overflow parsing '1e400'" "$BIN" verify-golden "$T/cfg"
fresh cfg qwen3_moe
edit "$T/cfg" config.json 'c["num_experts_per_tok"] = 0'
expect_error "config.json: field num_experts_per_tok = 0" "$BIN" verify-golden "$T/cfg"
edit "$T/cfg" config.json 'c["num_experts_per_tok"] = 9'
expect_error "config.json: field num_experts_per_tok = 9" "$BIN" verify-golden "$T/cfg"
fresh cfg deepseek_v3
edit "$T/cfg" config.json 'c["n_group"] = 0'
expect_error "config.json: field n_group = 0" "$BIN" verify-golden "$T/cfg"
edit "$T/cfg" config.json 'c["n_group"] = 3'
expect_error "config.json: field n_group = 3" "$BIN" verify-golden "$T/cfg"
# Model files that are FIFOs fail at once (each run is bounded by `timeout`: a hang is a failure).
for f in config.json model.safetensors tokenizer.json; do
  fresh fifo llama3
  rm "$T/fifo/$f"; mkfifo "$T/fifo/$f"
  expect_error "$f: is a FIFO" timeout 20 "$BIN" generate --model "$T/fifo" --prompt hi --max-tokens 1
done
# Tokenizer ids bounded by the vocabulary: no truncation of 2^40, no 9.7 GB table for 1e8.
fresh tok llama3
edit "$T/tok" tokenizer.json 'c["added_tokens"].append(dict(id=2**40, content="<x>", special=True))'
expect_error "tokenizer.json: added_tokens\[.*\].id 1099511627776 is outside the vocabulary" "$BIN" tokenize --tokenizer "$T/tok" --text hi
fresh tok llama3
edit "$T/tok" tokenizer.json 'c["model"]["vocab"]["zzz"] = 100000000'
expect_error 'tokenizer.json: model.vocab\["zzz"\] = 100000000 is outside the vocabulary' timeout 20 "$BIN" tokenize --tokenizer "$T/tok" --text hi
# safetensors offsets: misaligned, overlapping, header length short by one.
fresh st llama3
python3 - "$T/st/model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]; b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); names = sorted(k for k in h if k != "__metadata__")
a, b2 = names[0], names[1]
h[b2]["data_offsets"] = h[a]["data_offsets"][:]  # b2 claims a's bytes (and shape mismatch aside, overlaps)
h[b2]["shape"] = h[a]["shape"]; h[b2]["dtype"] = h[a]["dtype"]
hs = json.dumps(h).encode(); hs += b" " * ((8 - (len(hs) + 8) % 8) % 8)
open(p, "wb").write(struct.pack("<Q", len(hs)) + hs + b[8 + n:])
PY
expect_error "model.safetensors: tensor .* overlaps" "$BIN" verify-golden "$T/st"
fresh st llama3
python3 - "$T/st/model.safetensors" <<'PY'
import struct, sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); n = struct.unpack("<Q", b[:8])[0]
b[:8] = struct.pack("<Q", n - 1); open(p, "wb").write(b)
PY
expect_error "model.safetensors: " "$BIN" verify-golden "$T/st"
# Empty prompt, ids outside the vocabulary, malformed id list.
expect_error "empty" "$BIN" generate --model "$M" --prompt-ids ""
expect_error "empty" "$BIN" generate --model "$M" --prompt ""
expect_error "outside the vocabulary" "$BIN" generate --model "$M" --prompt-ids 1,2,99999
expect_error "invalid token id list" "$BIN" generate --model "$M" --prompt-ids 1,x,3
echo "$fails failed"
[ $fails -eq 0 ]
