"""python3 -m downpour.run against real daemons: it starts a local cluster
and N workers that join through the environment contract; its exit status
is the first failing worker's; Ctrl-C stops the workers and the cluster
and leaves no process behind.

Each launcher runs in a session of its own, so that every process it
started (workers and daemons, each in its own process group) can be found
afterwards by that session id.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np

from conftest import ROOT, bin_dir, work_dir

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "bsp_worker.py")
DEADLINE_S = 180


def launch(name, *args):
    d = work_dir(name)
    log = open(os.path.join(d, "launcher.log"), "wb")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    env.pop("DOWNPOUR_SCHEDULER", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "downpour.run", f"--bin_dir={bin_dir()}",
         f"--work_dir={d}/cluster"] + list(args),
        env=env, stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True)
    return proc, os.path.join(d, "launcher.log"), d


def text(log):
    with open(log, errors="replace") as f:
        return f.read()


def finish(proc, log):
    try:
        return proc.wait(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"the launcher hung:\n{text(log)[-3000:]}")


def session_processes(sid):
    """Pids of live processes in session `sid` (zombies excluded)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry))
    return pids


def assert_nothing_left(proc, log):
    # The launcher waited for every child; a straggler would be a bug.
    left = session_processes(proc.pid)
    assert not left, f"processes left behind: {left}\n{text(log)[-3000:]}"


def test_runs_the_workers_on_a_local_cluster():
    proc, log, d = launch("run-ok", "--nproc=2", WORKER, "--steps=6",
                          f"--out={work_dir('run-ok')}/rank-{{rank}}.npz")
    rc = finish(proc, log)
    assert rc == 0, text(log)[-3000:]
    assert "local cluster at 127.0.0.1:" in text(log)
    for r in range(2):
        assert f"rank {r} of 2 starts at clock 0" in text(log)
        assert f"rank {r} done" in text(log)
    a = np.load(f"{d}/rank-0.npz")
    b = np.load(f"{d}/rank-1.npz")
    for k in a.files:
        assert np.array_equal(a[k], b[k]), k
    assert_nothing_left(proc, log)


def test_exit_status_is_the_first_failure():
    proc, log, _ = launch("run-fail", "--nproc=2", "--grace_s=20", WORKER,
                          "--fail_rank=1")
    rc = finish(proc, log)
    assert rc == 3, text(log)[-3000:]
    assert "rank 1 (pid" in text(log) and "exited 3" in text(log)
    assert_nothing_left(proc, log)


def test_ctrl_c_stops_everything():
    proc, log, _ = launch("run-sigint", "--nproc=2", WORKER, "--steps=6",
                          "--pause_after=2")
    deadline = time.monotonic() + DEADLINE_S
    while text(log).count("paused at clock 2") < 2:
        assert proc.poll() is None, text(log)[-3000:]
        assert time.monotonic() < deadline, text(log)[-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    rc = finish(proc, log)
    assert rc == 128 + signal.SIGINT, text(log)[-3000:]
    assert "SIGINT: stopping" in text(log)
    assert_nothing_left(proc, log)


def test_bad_usage():
    proc, log, _ = launch("run-usage", "--nproc=2", "/no/such/script.py")
    assert finish(proc, log) == 2
    assert "no such file" in text(log)
