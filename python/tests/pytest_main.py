"""Runs pytest on the test files named on the command line (Bazel's py_test
entry point for python/tests; exits with pytest's status)."""

import os
import sys

import pytest

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    files = [os.path.join(here, f) for f in sys.argv[1:]]
    # -p no:cacheprovider: the runfiles tree is not ours to write to.
    sys.exit(pytest.main(["-v", "-p", "no:cacheprovider", "-rs"] + files))
