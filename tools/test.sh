#!/usr/bin/env bash
# Runs the whole test suite: installs what is missing, builds everything and
# runs every test target. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
echo "test: building and running every test target (bazel test //...)"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
bazel test //... "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
passed=$(grep -cE '^//.* PASSED' "$log" || true)
failed=$(grep -cE '^//.* (FAILED|TIMEOUT|NO STATUS)' "$log" || true)
echo "tests: ${passed} passed, ${failed} failed"
exit "$rc"
