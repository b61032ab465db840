#!/usr/bin/env bash
# An architecture without a model file must fail loudly, naming the problem: the qwen3_5
# fixture (its goldens and weights) under a config naming an architecture nobody implements.
set -u
BIN=$1
FIXTURE=$(realpath "$2")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
for f in "$FIXTURE"/*; do ln -s "$f" "$T/"; done
rm "$T/config.json"
sed 's/Qwen3_5ForCausalLM/FancyHybridForCausalLM/' "$FIXTURE/config.json" > "$T/config.json"
out=$("$BIN" verify-golden "$T" 2>&1)
rc=$?
echo "$out"
[ $rc -ne 0 ] && echo "$out" | grep -q 'unsupported architecture FancyHybridForCausalLM'
