#!/usr/bin/env bash
# Installs the Debian packages the build and tests need (only what is missing), as root.
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config libpcre2-dev nlohmann-json3-dev libcpp-httplib-dev
      libboost-dev
      libcli11-dev libfmt-dev libspdlog-dev libxxhash-dev libgtest-dev libgmock-dev libbenchmark-dev
      libopenblas-dev python3 curl
      libzmq3-dev cppzmq-dev libmsgpack-cxx-dev  # KV cache events: ZMQ PUB + msgpack (server/kv_events)
      nginx-light)                               # docs/DEPLOY.md's replicas test (tests/server/deploy)
# scripts/fuzz.sh: clang with libFuzzer and the sanitizer runtimes (not needed by the normal build).
[ "${1:-}" = "--fuzz" ] && PKGS+=(clang libclang-rt-dev libomp-dev)
# Node.js + npm (the test client) may come from another source than Debian's packages (e.g. a
# nodejs package that bundles npm, which conflicts with Debian's npm): only ask apt when missing.
command -v node >/dev/null 2>&1 || PKGS+=(nodejs)
command -v npm >/dev/null 2>&1 || PKGS+=(npm)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
