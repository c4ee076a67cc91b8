#!/usr/bin/env bash
# Runs the whole test suite: installs what is missing, builds everything and
# runs every test target. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
echo "test: building and running every test target (bazel test //...)"
bazel test //... "$@"
