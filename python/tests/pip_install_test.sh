#!/usr/bin/env bash
# pip-installs the package from a copy of the source tree (with the
# Bazel-built extension, as python/setup.py finds it) into a fresh venv,
# then imports the installed copy outside the tree and talks to real
# daemons with it.
set -euo pipefail

root="$PWD"  # the runfiles root of the workspace
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*" >&2; exit 1; }

src="$tmp/src"
rm -rf "$src" && mkdir -p "$src"
cp -rL "$root/python/setup.py" "$root/python/pyproject.toml" \
       "$root/python/README.md" "$root/python/downpour" "$src/"
[[ -f "$src/downpour/_downpour.so" ]] || fail "the built extension is not in runfiles"
# setup.py reads the version from the repository's VERSION, beside python/.
cp -L "$root/VERSION" "$tmp/VERSION"

/usr/bin/python3 -m venv --system-site-packages "$tmp/venv"
"$tmp/venv/bin/python" -m pip install --no-build-isolation --no-index \
    --disable-pip-version-check "$src" >"$tmp/pip.log" 2>&1 \
  || { cat "$tmp/pip.log"; fail "pip install"; }

# Under --config=asan the extension needs AddressSanitizer's runtime loaded
# first, which Debian's python3 is not built with (python/tests/
# pytest_main.py does the same; leaks are the C++ tests' to find).
libs=$(ldd "$src/downpour/_downpour.so") || fail "ldd of the extension"
asan=$(awk '/libasan\.so/ && $2 == "=>" {print $3; exit}' <<<"$libs")
if [[ -n "$asan" ]]; then
  # libstdc++ too, or ASan cannot intercept __cxa_throw (python3 is not C++).
  stdcxx=$(awk '/libstdc\+\+\.so/ && $2 == "=>" {print $3; exit}' <<<"$libs")
  echo "ASan build: preloading $asan $stdcxx"
  export LD_PRELOAD="$asan:$stdcxx${LD_PRELOAD:+:$LD_PRELOAD}"
  export ASAN_OPTIONS="detect_leaks=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
fi

cd "$tmp"  # away from both trees
"$tmp/venv/bin/python" - "$root" <<'PY'
import os, sys, tempfile
import numpy as np
import downpour
from downpour.local_cluster import LocalCluster

root = sys.argv[1]
venv = os.path.realpath(sys.prefix)
assert os.path.realpath(downpour.__file__).startswith(venv), downpour.__file__
assert os.path.realpath(downpour._downpour.__file__).startswith(venv)
here = os.path.dirname(downpour.__file__)
from importlib import metadata
with open(os.path.join(root, "VERSION")) as f:
    want = f.read().strip()
assert downpour.__version__ == want, (downpour.__version__, want)
assert metadata.version("downpour") == want, metadata.version("downpour")
requires = metadata.requires("downpour")
assert any(r.replace(" ", "").startswith("numpy") and "<2" in r
           for r in requires), requires
assert os.path.exists(os.path.join(here, "py.typed"))
assert os.path.exists(os.path.join(here, "_downpour.pyi"))

with LocalCluster(root, tempfile.mkdtemp(), num_servers=1) as cluster:
    with downpour.Client.connect(cluster.scheduler_address) as client:
        t = client.create_table("w", num_keys=10, width=2)
        client.put(t, None, np.arange(20, dtype=np.float32))
        got = client.get(t, [9, 0])
        assert got.tolist() == [[18, 19], [0, 1]], got
        try:
            client.open_table("missing")
            raise AssertionError("no error")
        except downpour.NotFoundError as e:
            assert e.code == downpour.StatusCode.NOT_FOUND
print("installed package works:", downpour.__file__)
PY
echo PASS
