"""A Python BSP worker killed with SIGKILL mid-run and replaced ends the
job bit for bit where an undisturbed run does (JobMember's resume
information, DistributedModel resuming at the rank's clock without
initializing the tables again).

The workers are processes (bsp_worker.py) that join through the
environment contract. Rank 0 is the one killed: a replacement that wrote
its fresh initial values over the trained tables would change every
parameter.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np

from conftest import ROOT, bin_dir, work_dir
from downpour.local_cluster import LocalCluster

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "bsp_worker.py")
STEPS = 12
DEADLINE_S = 180


def cluster(name):
    return LocalCluster(bin_dir(), work_dir(name), num_servers=2,
                        scheduler_flags=["--consistency=bsp",
                                         "--num_workers=2",
                                         "--dead_after_ms=1000"])


def start(c, rank, name, log, *args):
    env = dict(os.environ,
               PYTHONPATH=os.path.join(ROOT, "python"),
               DOWNPOUR_SCHEDULER=c.scheduler_address,
               DOWNPOUR_RANK=str(rank), DOWNPOUR_NAME=name)
    out = open(log, "wb")
    return subprocess.Popen([sys.executable, WORKER, f"--steps={STEPS}"] +
                            list(args), env=env, stdout=out,
                            stderr=subprocess.STDOUT)


def text(log):
    with open(log, errors="replace") as f:
        return f.read()


def wait_for(proc, log, deadline):
    try:
        rc = proc.wait(timeout=max(1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"{log}: still running:\n{text(log)[-3000:]}")
    assert rc == 0, f"{log}: exit {rc}:\n{text(log)[-3000:]}"


def wait_for_line(proc, log, line, deadline):
    while line not in text(log):
        assert proc.poll() is None, (f"{log} exited {proc.returncode} before "
                                     f"'{line}':\n{text(log)[-3000:]}")
        assert time.monotonic() < deadline, (
            f"{log}: no '{line}' in time:\n{text(log)[-3000:]}")
        time.sleep(0.05)


def params(path):
    with np.load(path) as f:
        return {k: f[k].copy() for k in f.files}


def test_killed_worker_replaced_ends_bit_for_bit():
    d = work_dir("resume")
    deadline = time.monotonic() + DEADLINE_S
    with cluster("resume-undisturbed") as c:
        procs = [start(c, r, f"w{r}", os.path.join(d, f"plain-{r}.log"),
                       f"--out={d}/plain-{r}.npz") for r in range(2)]
        for r, p in enumerate(procs):
            wait_for(p, os.path.join(d, f"plain-{r}.log"), deadline)
    want = params(f"{d}/plain-0.npz")
    np.testing.assert_equal(params(f"{d}/plain-1.npz"), want)

    with cluster("resume-killed") as c:
        log0 = os.path.join(d, "killed-0.log")
        first = start(c, 0, "w0", log0, "--pause_after=5")
        other = start(c, 1, "w1", os.path.join(d, "killed-1.log"),
                      f"--out={d}/killed-1.npz")
        wait_for_line(first, log0, "paused at clock 5", deadline)
        first.send_signal(signal.SIGKILL)
        first.wait()
        # Another pod name, the same rank (an Indexed Job's index).
        log_r = os.path.join(d, "replacement-0.log")
        replacement = start(c, 0, "w0-replacement", log_r,
                            f"--out={d}/replacement-0.npz")
        wait_for(replacement, log_r, deadline)
        wait_for(other, os.path.join(d, "killed-1.log"), deadline)
        assert "rank 0 of 2 starts at clock 5 resumed=True" in text(log_r), \
            text(log_r)
    for path in ("replacement-0.npz", "killed-1.npz"):
        got = params(f"{d}/{path}")
        assert got.keys() == want.keys()
        for k in want:
            assert np.array_equal(got[k], want[k]), (path, k)
