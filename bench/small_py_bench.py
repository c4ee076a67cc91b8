"""A 4-byte pull one at a time through the Python SDK, with the client's
default spin_wait and with spin_wait=0, in alternating rounds on one local
cluster: what a lone wait's spin (Operation.wait, ClientOptions::spin_wait)
is worth to a Python caller.

    bazel build -c opt //python:downpour //server:ps_server //scheduler:ps_scheduler
    PYTHONPATH=bazel-bin/python:python python3 bench/small_py_bench.py

Prints, per client, the median over rounds of each round's p50 and p99 in
microseconds, and the share of waits that spun and caught their reply.
"""

import argparse
import statistics
import sys
import tempfile
import time

import numpy as np

import downpour
from downpour.local_cluster import LocalCluster


def round_us(client, table, out, pulls):
    times = np.empty(pulls)
    for i in range(pulls):
        t0 = time.perf_counter()
        client.pull(table, 0, out)
        times[i] = time.perf_counter() - t0
    return np.percentile(times, 50) * 1e6, np.percentile(times, 99) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin_dir", default="bazel-bin")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--pulls", type=int, default=20000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as work, LocalCluster(
            a.bin_dir, work, num_servers=1) as cluster:
        clients = {
            "spin_wait=200us": downpour.Client.connect(
                cluster.scheduler_address),
            "spin_wait=0": downpour.Client.connect(
                cluster.scheduler_address, spin_wait=0),
        }
        table = clients["spin_wait=0"].create_table("small", num_keys=1)
        out = np.empty(1, dtype=np.float32)
        results = {name: [] for name in clients}
        for r in range(a.rounds):
            for name, client in clients.items():
                round_us(client, table, out, a.pulls // 10)  # warms up
                results[name].append(round_us(client, table, out, a.pulls))
            print(f"  round {r + 1} of {a.rounds}", file=sys.stderr)
        print("| client | p50 us | p99 us | waits that spun | spins that "
              "caught the reply |\n|---|---|---|---|---|")
        for name, client in clients.items():
            p50 = statistics.median(x[0] for x in results[name])
            p99 = statistics.median(x[1] for x in results[name])
            s = client.traffic
            pulls = a.rounds * (a.pulls + a.pulls // 10)
            spun = s.spins / pulls
            caught = s.spins_caught / max(1, s.spins)
            print(f"| {name} | {p50:.0f} | {p99:.0f} | {spun:.0%} | "
                  f"{caught:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
