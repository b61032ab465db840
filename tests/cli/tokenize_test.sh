#!/usr/bin/env bash
# CLI checks for `tokenspeed tokenize` and `tokenspeed bench-tokenizer`.
# usage: tokenize_test.sh path/to/tokenspeed
set -u
BIN=${1:?usage: tokenize_test.sh path/to/tokenspeed}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MODEL=$ROOT/models/pycoder
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0

pass() { echo "ok   $1"; }
failed() { echo "FAIL $1"; fails=$((fails + 1)); }
# expect NAME EXPECTED ACTUAL
expect() { if [[ "$2" == "$3" ]]; then pass "$1"; else failed "$1: expected [$2] got [$3]"; fi; }
# expect_error NAME CMD...: non-zero exit, exactly one line on stderr starting with "error:"
expect_error() {
  local name=$1
  shift
  "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  local lines
  lines=$(wc -l <"$TMP/err")
  if [[ $rc -ne 0 && $lines -eq 1 ]] && grep -q '^error: ' "$TMP/err" && [[ ! -s "$TMP/out" ]]; then
    pass "$name ($(cat "$TMP/err"))"
  else
    failed "$name: rc=$rc stderr_lines=$lines stderr=[$(cat "$TMP/err")] stdout=[$(cat "$TMP/out")]"
  fi
}

# Encoding: the goldens' first case, as a JSON list on one line.
expect "encode" "[44, 447, 316, 330, 7344]" "$("$BIN" tokenize --tokenizer "$MODEL" --text "Hello world")"
expect "encode --add-special" "[0, 44, 447, 316, 330, 7344]" \
  "$("$BIN" tokenize --tokenizer "$MODEL" --text "Hello world" --add-special)"
expect "tokenizer.json path" "[44, 447, 316, 330, 7344]" \
  "$("$BIN" tokenize --tokenizer "$MODEL/tokenizer.json" --text "Hello world")"
expect "empty text" "[]" "$("$BIN" tokenize --tokenizer "$MODEL" --text "")"
expect "special token in text" "[4, 3415, 7513, 1440, 225, 0]" \
  "$("$BIN" tokenize --tokenizer "$MODEL" --text "<|eot_id|> special inside text <|begin_of_text|>")"

# --text-file takes the bytes exactly: the trailing newline is encoded.
printf 'x = 1\n' >"$TMP/t.txt"
expect "text-file keeps newline" "$("$BIN" tokenize --tokenizer "$MODEL" --text $'x = 1\n')" \
  "$("$BIN" tokenize --tokenizer "$MODEL" --text-file "$TMP/t.txt")"
printf '\n' >"$TMP/nl.txt"
expect "text-file only a newline" "[203]" "$("$BIN" tokenize --tokenizer "$MODEL" --text-file "$TMP/nl.txt")"

# Decoding prints the text with nothing appended.
"$BIN" tokenize --tokenizer "$MODEL" --decode --ids 0,44,447,316,330,7344 >"$TMP/dec"
printf '<|begin_of_text|>Hello world' >"$TMP/want"
if cmp -s "$TMP/dec" "$TMP/want"; then pass "decode exact bytes"; else failed "decode exact bytes: [$(cat "$TMP/dec")]"; fi
expect "decode --skip-special" "Hello world" \
  "$("$BIN" tokenize --tokenizer "$MODEL" --decode --ids 0,44,447,316,330,7344 --skip-special)"
expect "decode list syntax" "Hello world" "$("$BIN" tokenize --tokenizer "$MODEL" --decode --ids "[44, 447, 316, 330, 7344]")"
"$BIN" tokenize --tokenizer "$MODEL" --decode --ids 203 >"$TMP/nl"
if [[ $(od -An -c "$TMP/nl" | tr -d ' ') == '\n' ]]; then pass "decode newline exact"; else failed "decode newline exact"; fi

# Round trip of multi-byte text through both directions.
TEXT='héllo 世界 🚀'
IDS=$("$BIN" tokenize --tokenizer "$MODEL" --text "$TEXT" | tr -d '[] \n')
expect "round trip" "$TEXT" "$("$BIN" tokenize --tokenizer "$MODEL" --decode --ids "$IDS")"
expect "sentencepiece round trip" "$TEXT" "$("$BIN" tokenize --tokenizer "$ROOT/tests/data/tokenizers/metaspace-1k" --decode \
  --ids "$("$BIN" tokenize --tokenizer "$ROOT/tests/data/tokenizers/metaspace-1k" --text "$TEXT" | tr -d '[] \n')")"

# Bad input: one-line error, non-zero exit.
expect_error "missing tokenizer" "$BIN" tokenize --tokenizer "$TMP/nope" --text hi
mkdir -p "$TMP/emptydir"
expect_error "dir without tokenizer.json" "$BIN" tokenize --tokenizer "$TMP/emptydir" --text hi
printf '{"model": {' >"$TMP/bad.json"
expect_error "invalid JSON" "$BIN" tokenize --tokenizer "$TMP/bad.json" --text hi
printf '{"model": {"type": "WordPiece", "vocab": {}}}' >"$TMP/wp.json"
expect_error "unsupported model" "$BIN" tokenize --tokenizer "$TMP/wp.json" --text hi
expect_error "id out of vocab" "$BIN" tokenize --tokenizer "$MODEL" --decode --ids 1,99999
expect_error "negative id" "$BIN" tokenize --tokenizer "$MODEL" --decode --ids -5
expect_error "bad id" "$BIN" tokenize --tokenizer "$MODEL" --decode --ids 1,x
expect_error "missing text file" "$BIN" tokenize --tokenizer "$MODEL" --text-file "$TMP/none.txt"
expect_error "no input" "$BIN" tokenize --tokenizer "$MODEL"
expect_error "decode without ids" "$BIN" tokenize --tokenizer "$MODEL" --decode
if "$BIN" tokenize --text hi >/dev/null 2>&1; then failed "--tokenizer required"; else pass "--tokenizer required"; fi
if "$BIN" tokenize --tokenizer "$MODEL" --text a --text-file "$TMP/t.txt" >/dev/null 2>&1; then
  failed "--text excludes --text-file"
else
  pass "--text excludes --text-file"
fi

# Every flag shows in --help.
HELP=$("$BIN" tokenize --help)
for f in --tokenizer --text --text-file --add-special --decode --ids --skip-special; do
  if grep -q -- "$f" <<<"$HELP"; then pass "help lists $f"; else failed "help lists $f"; fi
done
HELP=$("$BIN" bench-tokenizer --help)
for f in --tokenizer --text-file --mb --iters; do
  if grep -q -- "$f" <<<"$HELP"; then pass "bench help lists $f"; else failed "bench help lists $f"; fi
done

# The benchmark runs (tiny size) and reports MB/s, also as the two-word `bench tokenizer`.
if "$BIN" bench-tokenizer --tokenizer "$MODEL" --mb 0.05 --iters 1 | grep -q 'encode: .* MB/s'; then
  pass "bench-tokenizer"
else
  failed "bench-tokenizer"
fi
if "$BIN" bench tokenizer --tokenizer "$MODEL" --mb 0.05 --iters 1 --text-file "$TMP/t.txt" | grep -q 'encode: .* MB/s'; then
  pass "bench tokenizer --text-file"
else
  failed "bench tokenizer --text-file"
fi

echo "$fails failure(s)"
[[ $fails -eq 0 ]]
