#!/usr/bin/env bash
# Installs what is missing, builds, and starts the server on the bundled demo model.
# Extra arguments go to `tokenspeed serve` (e.g. --port 8000, --device cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
exec build/tokenspeed serve "$@"
