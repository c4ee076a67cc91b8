#!/usr/bin/env bash
# Installs every Debian package that the build, the tests and the demo need.
# Idempotent: when everything is present it only checks and returns.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap
  g++ clang
  libclang-rt-14-dev  # libFuzzer and clang's sanitizer runtimes (tools/fuzz.sh)
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev librocksdb-dev libzmq3-dev cppzmq-dev libeigen3-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  dataset-fashion-mnist
  libssl-dev openssl  # openssl: test certificates (tools/make_test_certs.sh)
  python3 gnuplot-nox
  procps iproute2
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

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
