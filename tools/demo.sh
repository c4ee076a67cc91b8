#!/usr/bin/env bash
# The main job: installs what it needs, builds, and trains an MLP on
# Fashion-MNIST with a scheduler, two servers and four workers on loopback.
# Extra arguments go to ps_demo (e.g. --compare, --mode=ssp --staleness=1).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bazel build //tools:ps_demo
exec bazel-bin/tools/ps_demo --out_dir=out/demo "$@"
