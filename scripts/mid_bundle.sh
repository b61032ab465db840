#!/usr/bin/env bash
# Lead's mid-session GPU snapshot of a helper branch: packs build/tokenspeed, build/test_cuda and
# scripts/gpu_<name>.sh of the calling worktree into /work/main/.devmid/<name>/ (git-ignored) and marks READY.
# Usage (from a worktree): scripts/mid_bundle.sh <name> [build-dir]
set -euo pipefail
name=$1; B=${2:-build}
dst=/work/main/.devmid/$name
rm -rf "$dst" && mkdir -p "$dst/bin"
for f in "$B"/tokenspeed "$B"/test_cuda; do strip -o "$dst/bin/$(basename "$f")" "$f"; done
cp "scripts/gpu_$name.sh" "$dst/"
tar -C "$dst" -cJf "$dst/bin.tar.xz" bin && rm -rf "$dst/bin"
git rev-parse HEAD > "$dst/COMMIT"
touch "$dst/READY"; du -sh "$dst"
