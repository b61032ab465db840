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
# Empty prompt, ids outside the vocabulary, malformed id list.
expect_error "empty" "$BIN" generate --model "$M" --prompt-ids ""
expect_error "empty" "$BIN" generate --model "$M" --prompt ""
expect_error "outside the vocabulary" "$BIN" generate --model "$M" --prompt-ids 1,2,99999
expect_error "invalid token id list" "$BIN" generate --model "$M" --prompt-ids 1,x,3
echo "$fails failed"
[ $fails -eq 0 ]
