"""Fixtures: real ps_scheduler and ps_server processes on 127.0.0.1.

The daemons come from the Bazel build: under `bazel test` from the runfiles
(the working directory is the workspace root there), and when pytest runs
from a source checkout, from bazel-bin (build //scheduler:ps_scheduler and
//server:ps_server first).
"""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

import downpour  # noqa: E402
from downpour.local_cluster import LocalCluster  # noqa: E402


def bin_dir() -> str:
    if os.path.exists(os.path.join(ROOT, "scheduler", "ps_scheduler")):
        return ROOT  # runfiles
    return os.path.join(ROOT, "bazel-bin")


def work_dir(name: str) -> str:
    base = os.environ.get("TEST_TMPDIR") or os.path.join(ROOT, "out", "pytest")
    path = os.path.join(base, name)
    os.makedirs(path, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def cluster(request):
    """Scheduler + 2 servers, shared by the tests of one module."""
    with LocalCluster(bin_dir(), work_dir(request.module.__name__),
                      num_servers=2) as c:
        yield c


@pytest.fixture
def client(cluster):
    with downpour.Client.connect(cluster.scheduler_address,
                                 op_timeout=20) as c:
        yield c
