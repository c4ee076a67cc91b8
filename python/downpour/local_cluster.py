"""A scheduler and servers as real processes on 127.0.0.1, for tests,
examples and benchmarks (the Python twin of launch/local_cluster.h)::

    with LocalCluster("bazel-bin", "/tmp/run", num_servers=2,
                      scheduler_flags=["--consistency=bsp",
                                       "--num_workers=4"]) as cluster:
        client = downpour.Client.connect(cluster.scheduler_address)

``bin_dir`` holds the daemons as Bazel lays them out
(``scheduler/ps_scheduler``, ``server/ps_server``) or side by side
(``ps_scheduler``, ``ps_server``: an install, the image's /usr/local/bin).
Every daemon listens on a free port (the scheduler reports its own through
an address file) and logs to ``work_dir``. The scheduler starts with
``--min_servers=num_servers``, so a table declaration waits until every
server has registered. ``stop()`` sends SIGTERM and raises if a daemon does
not exit cleanly. Not thread-safe.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import List, Optional, Sequence


class DaemonError(RuntimeError):
    """A daemon failed to start, exited early, or did not stop cleanly."""


class LocalCluster:
    def __init__(self, bin_dir: str, work_dir: str, *, num_servers: int = 2,
                 scheduler_flags: Sequence[str] = (),
                 server_flags: Sequence[str] = (),
                 start_timeout: float = 30.0,
                 new_process_group: bool = False):
        """bin_dir holds the daemons (above); work_dir receives logs and the
        address file. new_process_group: each daemon in a process group of
        its own, so that a terminal's Ctrl-C reaches only the caller, which
        then stops them in order (downpour.run)."""
        self.bin_dir = bin_dir
        self.work_dir = work_dir
        self.num_servers = num_servers
        self.scheduler_flags = list(scheduler_flags)
        self.server_flags = list(server_flags)
        self.start_timeout = start_timeout
        self.new_process_group = new_process_group
        self.scheduler_address = ""
        self._scheduler: Optional[subprocess.Popen] = None
        self._servers: List[subprocess.Popen] = []
        self._logs: List[object] = []
        self._killed: set = set()

    def _spawn(self, argv: List[str], log_name: str) -> subprocess.Popen:
        log = open(os.path.join(self.work_dir, log_name), "wb")
        self._logs.append(log)
        kwargs = {"process_group": 0} if self.new_process_group else {}
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, **kwargs)

    @staticmethod
    def find_binary(bin_dir: str, folder: str, name: str) -> Optional[str]:
        """bin_dir/folder/name or bin_dir/name, whichever is executable."""
        for path in (os.path.join(bin_dir, folder, name),
                     os.path.join(bin_dir, name)):
            if os.access(path, os.X_OK) and os.path.isfile(path):
                return path
        return None

    def log_tail(self, log_name: str, max_bytes: int = 4000) -> str:
        path = os.path.join(self.work_dir, log_name)
        try:
            with open(path, "rb") as f:
                f.seek(max(0, os.path.getsize(path) - max_bytes))
                return f.read().decode(errors="replace")
        except OSError as e:
            return f"(no log: {e})"

    def start(self) -> "LocalCluster":
        os.makedirs(self.work_dir, exist_ok=True)
        address_file = os.path.join(self.work_dir, "scheduler.address")
        if os.path.exists(address_file):
            os.remove(address_file)
        scheduler = self.find_binary(self.bin_dir, "scheduler", "ps_scheduler")
        server = self.find_binary(self.bin_dir, "server", "ps_server")
        if scheduler is None or server is None:
            raise DaemonError(
                f"{self.bin_dir} has no ps_scheduler and ps_server: build "
                "//scheduler:ps_scheduler and //server:ps_server")
        self._scheduler = self._spawn(
            [scheduler,
             "--listen=127.0.0.1:0", f"--address_file={address_file}",
             f"--min_servers={self.num_servers}"] + self.scheduler_flags,
            "scheduler.log")
        deadline = time.monotonic() + self.start_timeout
        while True:
            try:
                with open(address_file) as f:
                    line = f.read()
                if line.endswith("\n"):
                    self.scheduler_address = line.strip()
                    break
            except FileNotFoundError:
                pass
            if self._scheduler.poll() is not None:
                self.stop(check=False)
                raise DaemonError("ps_scheduler exited during start-up:\n" +
                                  self.log_tail("scheduler.log"))
            if time.monotonic() > deadline:
                self.stop(check=False)
                raise DaemonError(
                    f"ps_scheduler wrote no address in {self.start_timeout} s")
            time.sleep(0.02)
        for i in range(self.num_servers):
            self._servers.append(self._spawn(
                [server,
                 f"--scheduler={self.scheduler_address}",
                 f"--name=server-{i}"] + self.server_flags,
                f"server-{i}.log"))
        return self

    def check_alive(self) -> None:
        """Raises DaemonError if a daemon has exited."""
        procs = [("scheduler", self._scheduler)] + [
            (f"server-{i}", p) for i, p in enumerate(self._servers)]
        for name, p in procs:
            if p is not None and p.poll() is not None:
                raise DaemonError(f"{name} exited with status {p.returncode}:\n"
                                  + self.log_tail(f"{name}.log"))

    def server_pids(self) -> List[int]:
        """Process ids of the servers started (e.g. to read their memory)."""
        return [p.pid for p in self._servers]

    def kill_server(self, i: int) -> None:
        """SIGKILLs server i (a crash, for fault tests); stop() skips it."""
        p = self._servers[i]
        p.kill()
        p.wait()
        self._killed.add(p.pid)

    def stop(self, check: bool = True) -> None:
        """SIGTERM to every daemon (servers first), waiting up to 10 s each.
        With check, raises DaemonError naming the first that hung or exited
        with a non-zero status (one killed by the caller is skipped)."""
        failure = None
        named = [(f"server-{i}", p) for i, p in enumerate(self._servers)]
        named.append(("scheduler", self._scheduler))
        for name, p in named:
            if p is None:
                continue
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                    failure = failure or f"{name} hung on SIGTERM"
                    continue
            if p.returncode != 0 and p.pid not in self._killed:
                failure = failure or (
                    f"{name} exited with status {p.returncode}:\n" +
                    self.log_tail(f"{name}.log"))
        self._servers = []
        self._scheduler = None
        for log in self._logs:
            log.close()
        self._logs = []
        if check and failure:
            raise DaemonError(failure)

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        # Do not hide the test's own exception behind a shutdown error.
        self.stop(check=exc_type is None)
