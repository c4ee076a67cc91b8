"""Runs pytest on the test files named on the command line (Bazel's py_test
entry point for python/tests; exits with pytest's status).

Under a sanitizer build (bazel test --config=asan) the extension is linked
against AddressSanitizer's runtime, which must be loaded before anything
else in the process, and Debian's python3 is not built with it: the tests
then run in a python3 started again with the runtime preloaded. Leak
checking is off in that process (the interpreter keeps its objects until
exit by design); the daemons' leaks are the C++ tests' to find."""

import os
import subprocess
import sys

import pytest


def _linked(library, name):
    """Path of the library named like `name` that `library` loads, or None."""
    try:
        out = subprocess.run(["ldd", library], capture_output=True, text=True,
                             check=False).stdout
    except OSError:
        return None
    for line in out.splitlines():
        if name in line and "=>" in line:
            return line.split("=>")[1].split()[0]
    return None


def _rerun_with_asan_if_needed(here):
    extension = os.path.join(here, "..", "downpour", "_downpour.so")
    runtime = _linked(extension, "libasan.so")
    preload = os.environ.get("LD_PRELOAD", "")
    if runtime is None or runtime in preload.split(":"):
        return
    # libstdc++ too: ASan finds the real __cxa_throw (to intercept it) only
    # in libraries loaded when it starts, and python3 is not C++.
    libstdcxx = _linked(extension, "libstdc++.so")
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(p for p in (runtime, libstdcxx, preload) if p)
    env["ASAN_OPTIONS"] = ":".join(
        p for p in ("detect_leaks=0", os.environ.get("ASAN_OPTIONS", "")) if p)
    print("ASan build: running the tests with", runtime, "preloaded", flush=True)
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    _rerun_with_asan_if_needed(here)
    files = [os.path.join(here, f) for f in sys.argv[1:]]
    # -p no:cacheprovider: the runfiles tree is not ours to write to.
    sys.exit(pytest.main(["-v", "-p", "no:cacheprovider", "-rs"] + files))
