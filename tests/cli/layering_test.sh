#!/usr/bin/env bash
# The layers of src/ (the same table as the ts_<layer> libraries in CMakeLists.txt): a file may
# include headers of its own folder and of the layers listed for it, nothing above. A violation
# is printed as file:line and fails the test, before it turns into a link error or a cycle.
set -euo pipefail
cd "$(dirname "$0")/../.."
declare -A allowed=(
  [core]=""
  [io]="core"
  [chat]="core"
  [ops]="core"
  [tokenizer]="io core"
  [parallel]="ops core"
  [grammar]="tokenizer core"
  [models]="parallel ops io core"
  [runtime]="models grammar parallel tokenizer ops io core"
  [server]="runtime grammar tokenizer chat io core"
  [bench]="runtime models tokenizer ops io core"
  [cli]="bench server runtime models grammar parallel tokenizer chat ops io core"
)
bad=0
for dir in src/*/; do
  layer=$(basename "$dir")
  if [ -z "${allowed[$layer]+x}" ]; then
    echo "layering: src/$layer is in no layer: add it to this table and to CMakeLists.txt"
    bad=1
    continue
  fi
  ok=" $layer ${allowed[$layer]} "
  while IFS=: read -r file line inc; do
    target=$(sed -E 's/.*#include "([a-z_0-9]+)\/.*/\1/' <<< "$inc")
    [ -d "src/$target" ] || continue   # third-party headers ("nlohmann/json.hpp", "fmt/...")
    if [[ "$ok" != *" $target "* ]]; then
      echo "layering: $file:$line: $layer may not include $target/ ($inc)"
      bad=1
    fi
  done < <(grep -rnE '^#include "[a-z_0-9]+/' "$dir" || true)
done
[ $bad = 0 ] && echo "layering: ok (${#allowed[@]} layers)"
exit $bad
