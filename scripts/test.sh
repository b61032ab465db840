#!/usr/bin/env bash
# Installs what is missing, builds, installs the npm test client, and runs every test with ctest.
# GPU tests (label `cuda`) skip with a message where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
if [ -f tests/server/package.json ]; then
  (cd tests/server && npm install --no-audit --no-fund --loglevel=error)
fi
# Tests run two at a time on small CI machines: one OpenMP thread each, sleeping (not spinning)
# when idle, so parallel test processes do not starve each other.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j "${CTEST_JOBS:-2}" --timeout 900 "$@"
