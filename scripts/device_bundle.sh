#!/usr/bin/env bash
# Packs prebuilt binaries and the few shared libraries the GPU machine's image lacks into
# .device/ (git-ignored), for carrying to the GPU machine. Usage: scripts/device_bundle.sh [build]
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
rm -rf .device && mkdir -p .device/bin .device/lib
# LABS: which kernel labs to ship (default all; the travelling tree is capped at 64 MiB).
for f in "$B"/tokenspeed "$B"/test_cuda ${LABS:-"$B"/lab_*}; do
  [ -x "$f" ] && strip -o ".device/bin/$(basename "$f")" "$f"
done
# libzmq (KV cache events) and what it links that a bare image may lack.
for lib in libfmt.so.9 libspdlog.so.1.10 libpcre2-8.so.0 libxxhash.so.0 libcpp-httplib.so.0.11 libgomp.so.1 \
    libzmq.so.5 libsodium.so.23 libpgm-5.3.so.0 libnorm.so.1 libbsd.so.0 libmd.so.0 libgssapi_krb5.so.2 libkrb5.so.3 \
    libk5crypto.so.3 libkrb5support.so.0 libcom_err.so.2 libkeyutils.so.1; do
  p=$(ldconfig -p | awk -v l="$lib" '$1==l {print $NF; exit}') || true  # awk exits early: SIGPIPE under pipefail
  [ -n "$p" ] && cp -L "$p" .device/lib/
done
# The working tree that travels is capped (64 MiB with the models): ship the binaries compressed.
tar -C .device -cJf .device/bin.tar.xz bin && rm -rf .device/bin
du -sh .device
