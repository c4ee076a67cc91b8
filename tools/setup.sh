#!/usr/bin/env bash
# Installs every Debian package that the build, the tests and the demo need,
# the npm packages of the Kubernetes manifest tests (deploy/k8s/tests), and
# the formatting tools of tools/format.sh: Debian's clang-format, and
# buildifier from the npm registry into ./node_modules at the version that
# package-lock.json pins.
# Idempotent: when everything is present it only checks and returns.
#
#   bash tools/setup.sh           # everything
#   bash tools/setup.sh --build   # only what building the daemons needs
#                                 # (deploy/Containerfile's build stage)
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_PACKAGES=(
  bazel-bootstrap
  g++ clang
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev librocksdb-dev libzmq3-dev cppzmq-dev libeigen3-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  libssl-dev
  # Prometheus metrics (metrics/), and the gRPC reflection protocol that
  # tests/reflection_test calls.
  prometheus-cpp-dev grpc-proto
  # The Python extension (//python:downpour), which the image's python
  # target carries.
  python3-dev pybind11-dev
)
# python/ and sdk/: pybind11 and Python's headers for the module, NumPy,
# PyTorch and pytest for its tests, pip/venv for the install test, cmake and
# pkg-config for the SDK's. libopenblas0-openmp: PyTorch and NumPy call
# whichever libblas.so.3 is installed; without it that is the reference
# BLAS, ~10x slower, and torch.set_num_threads governs the OpenMP build's
# threads.
PACKAGES=(
  "${BUILD_PACKAGES[@]}"
  dataset-fashion-mnist
  libclang-rt-14-dev  # libFuzzer and clang's sanitizer runtimes (tools/fuzz.sh, tools/test.sh)
  openssl  # test certificates (tools/make_test_certs.sh)
  python3 gnuplot-nox
  python3-dev pybind11-dev python3-numpy python3-torch python3-pytest
  python3-setuptools python3-wheel python3-pip python3-venv
  libopenblas0-openmp
  cmake pkgconf
  procps iproute2
  # deploy/: the manifest tests (python3-yaml, python3-grpcio for gRPC
  # health probes) and the image test (podman with runc, debootstrap).
  python3-yaml python3-grpcio
  podman runc debootstrap
  # promtool (package prometheus): the alerts of
  # deploy/k8s/components/monitoring, checked and unit-tested.
  prometheus
  # tools/format.sh (buildifier comes from npm, below).
  clang-format
)

mode=all
if [[ "${1:-}" == "--build" ]]; then mode=build; PACKAGES=("${BUILD_PACKAGES[@]}"); fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [[ $mode == all ]]; then
  # kubectl (with its kustomize) and Node.js may come from elsewhere than
  # Debian (another apt source, a nodesource build); only a missing command
  # is installed from Debian. Debian 12's kubectl is 1.20, whose kustomize
  # is too old for deploy/k8s: the manifest tests then say so and skip.
  command -v kubectl >/dev/null || missing+=(kubernetes-client)
  command -v node >/dev/null || missing+=(nodejs)
  command -v npm >/dev/null || missing+=(npm)
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

if [[ $mode == all ]]; then
  # The schema validator's npm packages, pinned by package-lock.json, in a
  # project-local node_modules; reinstalled only when the lock changes.
  k8s_tests=deploy/k8s/tests
  if ! cmp -s "$k8s_tests/package-lock.json" \
       "$k8s_tests/node_modules/.downpour-package-lock.json" 2>/dev/null; then
    echo "setup: npm ci in $k8s_tests"
    (cd "$k8s_tests" && npm ci --no-audit --no-fund --loglevel=error)
    cp "$k8s_tests/package-lock.json" "$k8s_tests/node_modules/.downpour-package-lock.json"
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
fi
