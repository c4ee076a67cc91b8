"""Launches a training script as N Downpour workers, as torchrun does::

    python3 -m downpour.run --nproc=4 train.py [script args...]
    python3 -m downpour.run --nproc=4 --scheduler=10.0.0.5:7070 train.py

Without ``--scheduler`` (or ``DOWNPOUR_SCHEDULER``) it first starts a local
cluster on 127.0.0.1 (a scheduler with ``--consistency``, ``--staleness``
and ``--num_workers=nproc``, and ``--servers`` servers) and stops it at the
end; with one it joins that cluster. Each worker is
``python3 train.py [args]`` with the environment contract of
:mod:`downpour.env` set (``DOWNPOUR_SCHEDULER``, ``DOWNPOUR_RANK``,
``DOWNPOUR_NAME``, ``DOWNPOUR_WORLD_SIZE``, and the secret and TLS files
given here), so that the script's ``downpour.JobMember.join()`` and
``downpour.Client.connect()`` need no arguments.

Exit status: 0 when every worker exited 0; otherwise the first failure's
(a worker killed by signal S: 128 + S), after the others were stopped
(SIGTERM, then SIGKILL after ``--grace_s``); 130 on Ctrl-C (SIGINT) and
143 on SIGTERM, which stop the workers, then the local cluster; 2 for bad
usage; 1 if the local cluster cannot start.

The daemons come from ``--bin_dir`` (or ``DOWNPOUR_BIN_DIR``), holding
``scheduler/ps_scheduler`` and ``server/ps_server`` (Bazel's bazel-bin) or
``ps_scheduler`` and ``ps_server`` (an install, the image's
/usr/local/bin); by default the source checkout's bazel-bin, then PATH.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

from downpour import env as _env
from downpour.local_cluster import DaemonError, LocalCluster

EXIT_USAGE = 2
EXIT_CLUSTER = 1


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python3 -m downpour.run",
        description="Runs a training script as N Downpour workers, on a "
        "local cluster it starts or on a running one.")
    ap.add_argument("--nproc", "--nproc_per_node", type=int, default=1,
                    help="worker processes to start (default 1)")
    ap.add_argument("--scheduler", default=os.environ.get(_env.SCHEDULER),
                    help="host:port of a running cluster's scheduler "
                    f"(default ${_env.SCHEDULER}); without it a local "
                    "cluster is started")
    ap.add_argument("--rank_offset", type=int, default=0,
                    help="ranks are rank_offset + [0, nproc) (several "
                    "launchers on one job)")
    ap.add_argument("--servers", type=int, default=2,
                    help="local cluster: servers to start")
    ap.add_argument("--consistency", choices=["bsp", "ssp", "asp"],
                    default="bsp", help="local cluster: the policy")
    ap.add_argument("--staleness", type=int, default=0,
                    help="local cluster: SSP's bound")
    ap.add_argument("--bin_dir", default=os.environ.get("DOWNPOUR_BIN_DIR"),
                    help="local cluster: folder of ps_scheduler and "
                    "ps_server")
    ap.add_argument("--work_dir", default="",
                    help="local cluster: logs go here (default: a new "
                    "temporary folder)")
    ap.add_argument("--cluster_secret_file",
                    default=os.environ.get(_env.CLUSTER_SECRET_FILE),
                    help="the cluster's secret (the local cluster uses it "
                    "too)")
    ap.add_argument("--job_token_file",
                    default=os.environ.get(_env.JOB_TOKEN_FILE),
                    help="the job token, for a scheduler that has one")
    ap.add_argument("--grace_s", type=float, default=15.0,
                    help="seconds a worker gets to stop after SIGTERM")
    ap.add_argument("script", help="the training script")
    ap.add_argument("script_args", nargs=argparse.REMAINDER,
                    help="its arguments")
    return ap


def find_bin_dir(given: Optional[str]) -> str:
    """A folder LocalCluster can start the daemons from."""
    candidates = [given] if given else [
        os.path.normpath(os.path.join(os.path.dirname(__file__), os.pardir,
                                      os.pardir, "bazel-bin")),
        os.path.dirname(shutil.which("ps_scheduler") or "") or None,
    ]
    for d in candidates:
        if d and LocalCluster.find_binary(d, "scheduler", "ps_scheduler"):
            return d
    raise DaemonError(
        "no ps_scheduler and ps_server found (looked in "
        f"{', '.join(d for d in candidates if d) or 'nothing'}): pass "
        "--bin_dir, or build //scheduler:ps_scheduler //server:ps_server")


class _Stop(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stop(signum, _frame):
    raise _Stop(signum)


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class Launcher:
    """Starts the workers and watches them. Not thread-safe."""

    def __init__(self, args: argparse.Namespace, scheduler: str):
        self.args = args
        self.scheduler = scheduler
        self.procs: List[subprocess.Popen] = []

    def worker_env(self, rank: int) -> Dict[str, str]:
        env = dict(os.environ)
        env[_env.SCHEDULER] = self.scheduler
        env[_env.RANK] = str(rank)
        env[_env.NAME] = f"{os.uname().nodename}-{os.getpid()}-{rank}"
        env["DOWNPOUR_WORLD_SIZE"] = str(self.args.nproc)
        if self.args.cluster_secret_file:
            env[_env.CLUSTER_SECRET_FILE] = self.args.cluster_secret_file
        if self.args.job_token_file:
            env[_env.JOB_TOKEN_FILE] = self.args.job_token_file
        return env

    def start(self) -> None:
        for i in range(self.args.nproc):
            rank = self.args.rank_offset + i
            # A process group of its own: Ctrl-C reaches the launcher only,
            # which stops the workers in order.
            self.procs.append(subprocess.Popen(
                [sys.executable, self.args.script] + self.args.script_args,
                env=self.worker_env(rank), stdin=subprocess.DEVNULL,
                process_group=0))

    def wait(self) -> int:
        """Until every worker exited 0 (returns 0) or one failed (returns
        its exit code)."""
        while True:
            running = False
            for p in self.procs:
                rc = p.poll()
                if rc is None:
                    running = True
                elif rc != 0:
                    rank = self.args.rank_offset + self.procs.index(p)
                    print(f"downpour.run: rank {rank} (pid {p.pid}) exited "
                          f"{rc}; stopping the others", file=sys.stderr,
                          flush=True)
                    return _exit_code(rc)
            if not running:
                return 0
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM to every worker still running; SIGKILL after grace_s."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.args.grace_s
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.nproc < 1:
        print("downpour.run: --nproc must be >= 1", file=sys.stderr)
        return EXIT_USAGE
    if not os.path.isfile(args.script):
        print(f"downpour.run: {args.script}: no such file", file=sys.stderr)
        return EXIT_USAGE
    previous = {s: signal.signal(s, _raise_stop)
                for s in (signal.SIGINT, signal.SIGTERM)}
    cluster: Optional[LocalCluster] = None
    launcher: Optional[Launcher] = None
    code = 0
    try:
        scheduler = args.scheduler
        if not scheduler:
            work_dir = args.work_dir or tempfile.mkdtemp(
                prefix="downpour-run-")
            flags = [f"--consistency={args.consistency}",
                     f"--staleness={args.staleness}",
                     f"--num_workers={args.nproc}"]
            secret = ([f"--cluster_secret_file={args.cluster_secret_file}"]
                      if args.cluster_secret_file else [])
            try:
                cluster = LocalCluster(
                    find_bin_dir(args.bin_dir), work_dir,
                    num_servers=args.servers,
                    scheduler_flags=flags + secret, server_flags=secret,
                    new_process_group=True)
                cluster.start()
            except DaemonError as e:
                print(f"downpour.run: {e}", file=sys.stderr)
                return EXIT_CLUSTER
            scheduler = cluster.scheduler_address
            print(f"downpour.run: local cluster at {scheduler} "
                  f"({args.servers} servers, {args.consistency}), logs in "
                  f"{work_dir}", file=sys.stderr, flush=True)
        launcher = Launcher(args, scheduler)
        launcher.start()
        code = launcher.wait()
    except _Stop as e:
        print(f"downpour.run: {e}: stopping", file=sys.stderr, flush=True)
        code = 128 + e.signum
    finally:
        # Stopping must not be interrupted half-way by a second Ctrl-C.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if launcher is not None:
            launcher.stop()
        if cluster is not None:
            try:
                cluster.stop(check=code == 0)
            except DaemonError as e:
                print(f"downpour.run: {e}", file=sys.stderr)
                code = code or EXIT_CLUSTER
        for s, handler in previous.items():
            signal.signal(s, handler)
    return code


if __name__ == "__main__":
    sys.exit(main())
