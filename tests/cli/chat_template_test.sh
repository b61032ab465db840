#!/usr/bin/env bash
# Drives `tokenspeed chat-template` end to end: template sources (--template, --model with
# chat_template.jinja or tokenizer_config.json), bos/eos defaults, --date, stdin context, exact
# output (nothing appended) and error exits.
# usage: chat_template_test.sh path/to/tokenspeed
set -u
BIN=${1:?usage: $0 path/to/tokenspeed}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0

fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect_out NAME EXPECTED_TEXT ARGS...: stdout must equal EXPECTED_TEXT byte for byte, exit 0.
expect_out() {
  local name=$1 want=$2
  shift 2
  printf '%s' "$want" > "$T/want"
  if ! "$BIN" chat-template "$@" > "$T/got" 2> "$T/err"; then
    fail "$name: exit $? ($(cat "$T/err"))"
  elif ! cmp -s "$T/want" "$T/got"; then
    fail "$name: output differs"
    diff <(od -c "$T/want") <(od -c "$T/got") | head -20
  fi
}

# expect_fail NAME STDERR_SUBSTRING ARGS...: must exit non-zero, print nothing on stdout, and
# mention STDERR_SUBSTRING on stderr.
expect_fail() {
  local name=$1 want=$2
  shift 2
  if "$BIN" chat-template "$@" > "$T/got" 2> "$T/err"; then
    fail "$name: exited 0"
  elif [ -s "$T/got" ]; then
    fail "$name: wrote to stdout: $(cat "$T/got")"
  elif ! grep -qF -- "$want" "$T/err"; then
    fail "$name: stderr lacks '$want': $(cat "$T/err")"
  fi
}

cat > "$T/ctx.json" <<'JSON'
{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi \u00e9 "}],
 "add_generation_prompt": true, "flavor": "mint"}
JSON

# --help shows every flag
"$BIN" chat-template --help > "$T/help" 2>&1 || fail "--help exited non-zero"
for flag in --model --template --context-json --date; do
  grep -q -- "$flag" "$T/help" || fail "--help does not list $flag"
done

# --template: extra context keys are variables; output has no trailing newline added
printf '%s' $'{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}\n{% endfor %}{{ flavor }}' > "$T/t.jinja"
expect_out template "<system>Be brief.
<user>Hi é
mint" --template "$T/t.jinja" --context-json "$T/ctx.json"

# --model with chat_template.jinja + bos_token from tokenizer_config.json
L3=$'<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi é<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n'
expect_out model_dir "$L3" --model "$ROOT/tests/data/llama3" --context-json "$T/ctx.json"

# a bos_token in the context wins over tokenizer_config.json
printf '%s' '{"messages": [], "bos_token": "<B>", "add_generation_prompt": false}' > "$T/bos.json"
expect_out context_bos_wins "<B>" --model "$ROOT/tests/data/llama3" --context-json "$T/bos.json"

# tokenizer_config.json chat_template as a string, special tokens as AddedToken objects
mkdir -p "$T/m1"
cat > "$T/m1/tokenizer_config.json" <<'JSON'
{"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
 "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{% endfor %}{{ eos_token }}"}
JSON
expect_out config_string "<s>[system][user]</s>" --model "$T/m1" --context-json "$T/ctx.json"

# chat_template as a list of {name, template}: "default" wins, else the first
mkdir -p "$T/m2" "$T/m3"
cat > "$T/m2/tokenizer_config.json" <<'JSON'
{"chat_template": [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "default:{{ messages|length }}"}]}
JSON
cat > "$T/m3/tokenizer_config.json" <<'JSON'
{"chat_template": [{"name": "rag", "template": "first"}, {"name": "tool_use", "template": "second"}]}
JSON
expect_out config_list_default "default:2" --model "$T/m2" --context-json "$T/ctx.json"
expect_out config_list_first "first" --model "$T/m3" --context-json "$T/ctx.json"

# --date fixes strftime_now
printf '%s' "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %A') }}" > "$T/date.jinja"
expect_out date "26 Jul 2026|2026-07-26 Sunday" --template "$T/date.jinja" --context-json "$T/ctx.json" --date 2026-07-26

# the context can come from stdin
"$BIN" chat-template --template "$T/t.jinja" --context-json - < "$T/ctx.json" > "$T/got" 2> "$T/err" || fail "stdin: $(cat "$T/err")"
tail -c 4 "$T/got" | grep -q '^mint$' || fail "stdin: unexpected output $(cat "$T/got")"

# errors: message with position on stderr, non-zero exit, nothing on stdout
printf '%s' $'ok\n{{ messages[0].content + 1 }}' > "$T/bad.jinja"
expect_fail runtime_error "line 2, column" --template "$T/bad.jinja" --context-json "$T/ctx.json"
printf '%s' "{% if true %}unterminated" > "$T/syntax.jinja"
expect_fail syntax_error "TemplateSyntaxError" --template "$T/syntax.jinja" --context-json "$T/ctx.json"
printf '%s' "{{ raise_exception('roles must alternate') }}" > "$T/raise.jinja"
expect_fail raise_exception "roles must alternate" --template "$T/raise.jinja" --context-json "$T/ctx.json"
printf '%s' '[1, 2]' > "$T/array.json"
expect_fail context_not_object "JSON object" --template "$T/t.jinja" --context-json "$T/array.json"
printf '%s' '{"messages": ' > "$T/broken.json"
expect_fail context_invalid_json "invalid JSON" --template "$T/t.jinja" --context-json "$T/broken.json"
expect_fail bad_date "YYYY-MM-DD" --template "$T/t.jinja" --context-json "$T/ctx.json" --date 26/07/2026
expect_fail no_template_source "--model or --template" --context-json "$T/ctx.json"
expect_fail both_sources "excludes" --model "$T/m1" --template "$T/t.jinja" --context-json "$T/ctx.json"
expect_fail no_context "context-json" --template "$T/t.jinja"
expect_fail missing_template_file "cannot read" --template "$T/nope.jinja" --context-json "$T/ctx.json"
# a model's named templates: "tool_use" when the context has tools (as the server picks)
mkdir -p "$T/named"
printf '%s' '{"chat_template": [{"name": "default", "template": "DEF"}, {"name": "tool_use", "template": "TOOLS{{ tools|length }}"}]}' > "$T/named/tokenizer_config.json"
printf '%s' '{"messages": [], "tools": [{"type": "function", "function": {"name": "f"}}]}' > "$T/tools.json"
expect_out named_tool_use "TOOLS1" --model "$T/named" --context-json "$T/tools.json"
expect_out named_default "DEF" --model "$T/named" --context-json "$T/ctx.json"
mkdir -p "$T/empty"
expect_fail model_without_template "no chat_template" --model "$T/empty" --context-json "$T/ctx.json"

if [ "$fails" -ne 0 ]; then
  echo "$fails chat-template check(s) failed"
  exit 1
fi
echo "chat-template CLI: all checks passed"
