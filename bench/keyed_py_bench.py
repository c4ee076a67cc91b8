"""A keyed batch of 10M sorted keys, width 1, on a dense table, pushed (sgd)
and pulled through the Python SDK with NumPy arrays: issue 21's figure as
its users meet it (ps_bench's `keyed` section is the same in C++).

    bazel build -c opt //python:downpour //server:ps_server //scheduler:ps_scheduler
    PYTHONPATH=bazel-bin/python:python python3 bench/keyed_py_bench.py

Prints milliseconds per push and pull (median of --reps) for each stride
and server count, one line per configuration.
"""

import argparse
import statistics
import sys
import tempfile
import time

import numpy as np

import downpour
from downpour.local_cluster import LocalCluster


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin_dir", default="bazel-bin")
    ap.add_argument("--keys", type=int, default=10_000_000)
    ap.add_argument("--strides", default="1,2")
    ap.add_argument("--servers", default="1,2")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    print("| stride | servers | push ms | pull ms |\n|---|---|---|---|")
    for servers in [int(s) for s in a.servers.split(",")]:
        with tempfile.TemporaryDirectory() as work, LocalCluster(
                a.bin_dir, work, num_servers=servers) as cluster:
            client = downpour.Client.connect(cluster.scheduler_address)
            for stride in [int(s) for s in a.strides.split(",")]:
                table = client.create_table(
                    f"keyed{stride}", num_keys=a.keys * stride, width=1,
                    handler="sgd", handler_params={"learning_rate": 0.1})
                keys = np.arange(0, a.keys * stride, stride, dtype=np.uint64)
                grads = np.full(a.keys, 0.01, dtype=np.float32)
                out = np.empty(a.keys, dtype=np.float32)
                times = {"push": [], "pull": []}
                for rep in range(a.reps + 1):  # the first warms up
                    t0 = time.perf_counter()
                    client.push(table, keys, grads)
                    t1 = time.perf_counter()
                    client.pull(table, keys, out)
                    t2 = time.perf_counter()
                    if rep > 0:
                        times["push"].append((t1 - t0) * 1e3)
                        times["pull"].append((t2 - t1) * 1e3)
                    print(f"  stride {stride}, {servers} server(s): rep "
                          f"{rep} of {a.reps}", file=sys.stderr)
                # Every key got reps + 1 updates of -0.1 * 0.01.
                want = -0.001 * (a.reps + 1)
                if not np.allclose(out, want, atol=1e-5):
                    print(f"wrong values: {out[:4]} != {want}",
                          file=sys.stderr)
                    return 1
                print(f"| {stride} | {servers} | "
                      f"{statistics.median(times['push']):.0f} | "
                      f"{statistics.median(times['pull']):.0f} |",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
