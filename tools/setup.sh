#!/usr/bin/env bash
# Installs every Debian package that the build, the tests and the demo need.
# Idempotent: when everything is present it only checks and returns.
set -euo pipefail

# libopenblas0-openmp: PyTorch and NumPy call whichever libblas.so.3 is
# installed; without it that is the reference BLAS, ~10x slower, and
# torch.set_num_threads governs the OpenMP build's threads.
PACKAGES=(
  bazel-bootstrap
  g++ clang
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev librocksdb-dev libzmq3-dev cppzmq-dev libeigen3-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  dataset-fashion-mnist
  libssl-dev
  python3 gnuplot-nox
  python3-dev pybind11-dev python3-numpy python3-torch python3-pytest
  python3-setuptools python3-wheel python3-pip python3-venv
  libopenblas0-openmp
  cmake pkgconf
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
