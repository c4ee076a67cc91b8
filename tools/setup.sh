#!/usr/bin/env bash
# Installs every Debian package that the build, the tests and the demo need,
# and the formatting tools (tools/format.sh): Debian's clang-format, and
# buildifier from the npm registry into ./node_modules at the version that
# package-lock.json pins.
# Idempotent: when everything is present it only checks and returns.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  bazel-bootstrap
  g++ clang
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev librocksdb-dev libzmq3-dev cppzmq-dev libeigen3-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  dataset-fashion-mnist
  libssl-dev
  python3 gnuplot-nox
  procps iproute2
  clang-format nodejs
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# Debian's nodejs leaves npm to its own package; NodeSource's bundles it
# (and conflicts with Debian's npm).
if ! command -v npm >/dev/null 2>&1; then
  missing+=(npm)
fi

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi

# buildifier for tools/format.sh, at the version package-lock.json pins.
want=$(sed -n 's/.*"@bazel\/buildifier": "\(.*\)".*/\1/p' package.json)
if [[ -x node_modules/.bin/buildifier ]] &&
  node_modules/.bin/buildifier --version 2>/dev/null | grep -q "version: ${want}\b"; then
  echo "setup: buildifier ${want} present"
else
  echo "setup: installing buildifier ${want} into node_modules"
  # Only tools/format.sh needs it: a machine without the npm registry can
  # still build and test.
  if ! npm ci --no-audit --no-fund --loglevel=error; then
    echo "setup: WARNING: could not install buildifier; tools/format.sh" \
      "will not run until 'npm ci' succeeds" >&2
  fi
fi
