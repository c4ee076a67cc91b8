#!/usr/bin/python3
"""Trains the MLP (784-256-10) on Fashion-MNIST with PyTorch and Downpour:
a scheduler, servers and N worker processes on 127.0.0.1, each worker a
plain PyTorch training loop around downpour.torch.DistributedModel.

    bazel build //python:downpour //scheduler:ps_scheduler //server:ps_server
    /usr/bin/python3 python/examples/fashion_mnist.py              # BSP
    /usr/bin/python3 python/examples/fashion_mnist.py --mode=asp
    /usr/bin/python3 python/examples/fashion_mnist.py --mode=ssp --staleness=3

It prints the test accuracy as training goes (rank 0's model, evaluated
after training from snapshots, so evaluation does not slow the job), the
final accuracy, seconds to --target accuracy and seconds per epoch, and
writes out_dir/result.json. bench/torch_ddp_bench.py reuses these pieces to
compare against DistributedDataParallel.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import downpour
except ImportError:  # a source checkout: python/ is the package's parent
    sys.path.insert(0, os.path.dirname(HERE))
    import downpour
import downpour.torch as dpt  # noqa: E402
from downpour.local_cluster import LocalCluster  # noqa: E402

DATA_DIR = "/usr/share/datasets/fashion-mnist"
TRAIN_EXAMPLES = 60000


# -- data, model, evaluation (shared with bench/torch_ddp_bench.py) ----------

def _read_idx(path: str) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big")
                  for i in range(dims))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(
        shape)


def load_fashion_mnist(data_dir: str, train: bool
                       ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Images as float32 rows in [0, 1] (as the C++ loader), labels int64."""
    prefix = "train" if train else "t10k"
    images = _read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
    labels = _read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(images.reshape(len(images), -1).astype(np.float32)
                         / 255.0)
    return x, torch.from_numpy(labels.astype(np.int64))


def shard(x: torch.Tensor, y: torch.Tensor, rank: int, total: int):
    """Examples rank, rank + total, ... (as the C++ workers shard)."""
    return x[rank::total].contiguous(), y[rank::total].contiguous()


class MLP(torch.nn.Module):
    """784-256-10 with ReLU, He-normal weights and zero biases, as
    models/model.h's MakeMlp."""

    def __init__(self, sizes=(784, 256, 10)):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        for layer in self.layers:
            torch.nn.init.normal_(layer.weight, 0.0,
                                  (2.0 / layer.in_features) ** 0.5)
            torch.nn.init.zeros_(layer.bias)

    def forward(self, x):
        for layer in self.layers[:-1]:
            x = F.relu(layer(x))
        return self.layers[-1](x)


def batches(num_examples: int, batch: int, seed: int, rank: int):
    """Endless mini-batches of indices: a fresh permutation every epoch."""
    rng = np.random.default_rng(seed * 1000003 + rank)
    while True:
        order = torch.from_numpy(rng.permutation(num_examples))
        for b in range(0, num_examples - batch + 1, batch):
            yield order[b:b + batch]


class Snapshots:
    """Rank 0's parameters every few steps with the time since the start,
    evaluated on the test set after training."""

    def __init__(self):
        self.items: List[Tuple[float, int, Dict[str, torch.Tensor]]] = []

    def take(self, seconds: float, step: int, module: torch.nn.Module):
        self.items.append((seconds, step, {k: v.detach().clone() for k, v in
                                           module.state_dict().items()}))

    def evaluate(self, data_dir: str) -> List[Tuple[float, int, float]]:
        x, y = load_fashion_mnist(data_dir, train=False)
        model = MLP()
        curve = []
        with torch.no_grad():
            for seconds, step, state in self.items:
                model.load_state_dict(state)
                accuracy = (model(x).argmax(1) == y).float().mean().item()
                curve.append((seconds, step, accuracy))
        return curve


def summarize(curve: List[Tuple[float, int, float]], target: float,
              train_seconds: float, steps: int, workers: int, batch: int
              ) -> Dict[str, float]:
    reached = [s for s, _, a in curve if a >= target]
    epochs = steps * workers * batch / TRAIN_EXAMPLES
    return {
        "final_accuracy": curve[-1][2] if curve else 0.0,
        "seconds_to_target": reached[0] if reached else -1.0,
        "train_seconds": train_seconds,
        "epochs": epochs,
        "seconds_per_epoch": train_seconds / epochs if epochs else 0.0,
    }


# -- one Downpour worker --------------------------------------------------------

def run_worker(args) -> None:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)  # rank 0's initialization is the one used
    downpour.tune_allocator()
    member = downpour.JobMember.join(args.scheduler,
                                     name=f"worker-{args.worker_index}")
    client = downpour.Client.connect(args.scheduler, op_timeout=120)
    rank, total = member.rank, member.policy.total_workers
    x, y = load_fashion_mnist(args.data_dir, train=True)
    x, y = shard(x, y, rank, total)
    if args.mode == "bsp":
        optimizer = dpt.SGD(lr=args.lr, warmup_steps=args.warmup_steps,
                            warmup_from=args.warmup_from)
    else:
        optimizer = dpt.Adagrad(lr=args.async_lr)
    model = dpt.DistributedModel(MLP(), client, member, optimizer=optimizer,
                                 name="mlp")
    snapshots = Snapshots()
    start = time.perf_counter()
    source = batches(len(y), args.batch, args.seed, rank)
    for step in range(args.steps):
        if rank == 0 and step % args.eval_every == 0:
            model.refresh()
            snapshots.take(time.perf_counter() - start, step, model.module)
        idx = next(source)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        model.step(loss.item(), examples=len(idx))
    model.finish()
    # Under SSP and ASP rank 0 may finish well before the others: the last
    # snapshot is of the job's model once every worker's steps have landed,
    # not of rank 0's view at its own last step.
    member.barrier("trained", timeout=args.timeout_s)
    train_seconds = time.perf_counter() - start  # until the last worker's end
    if rank == 0:
        model.pull()
    member.leave(finished=True)  # the scheduler need not wait for silence
    if rank == 0:
        snapshots.take(train_seconds, args.steps, model.module)
        curve = snapshots.evaluate(args.data_dir)
        result = summarize(curve, args.target, train_seconds, args.steps,
                           total, args.batch)
        result.update(mode=args.mode, curve=curve, stats=model.stats())
        with open(os.path.join(args.out_dir, "result.json"), "w") as f:
            json.dump(result, f)
    client.close()


# -- the job: daemons and worker processes -------------------------------------

def scheduler_flags(mode: str, workers: int, staleness: int) -> List[str]:
    flags = [f"--consistency={mode}", f"--num_workers={workers}"]
    if mode == "ssp":
        flags.append(f"--staleness={staleness}")
    return flags


def run_job(args) -> Dict[str, object]:
    """Starts the cluster and the workers, waits for them, returns rank 0's
    result."""
    os.makedirs(args.out_dir, exist_ok=True)
    result_path = os.path.join(args.out_dir, "result.json")
    if os.path.exists(result_path):
        os.remove(result_path)
    with LocalCluster(args.bin_dir, args.out_dir, num_servers=args.servers,
                      scheduler_flags=scheduler_flags(
                          args.mode, args.workers, args.staleness)) as cluster:
        procs = []
        for i in range(args.workers):
            argv = [sys.executable, os.path.abspath(__file__),
                    f"--worker_index={i}",
                    f"--scheduler={cluster.scheduler_address}"]
            argv += [f"--{k}={v}" for k, v in vars(args).items()
                     if k not in ("worker_index", "scheduler")]
            log = open(os.path.join(args.out_dir, f"worker-{i}.log"), "wb")
            procs.append((subprocess.Popen(argv, stdout=log,
                                           stderr=subprocess.STDOUT), log))
        deadline = time.monotonic() + args.timeout_s
        failed = None
        for i, (p, log) in enumerate(procs):
            try:
                rc = p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait()
                failed = failed or f"worker {i} timed out"
            log.close()
            if rc != 0:
                failed = failed or f"worker {i} exited with status {rc}"
        if failed:
            for i in range(args.workers):
                print(f"--- worker-{i}.log (tail)", file=sys.stderr)
                print(cluster.log_tail(f"worker-{i}.log", 2000),
                      file=sys.stderr)
            raise RuntimeError(failed)
    with open(result_path) as f:
        return json.load(f)


def parse_args(argv: Optional[List[str]] = None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", default="bsp", choices=["bsp", "ssp", "asp"])
    p.add_argument("--staleness", type=int, default=3, help="SSP bound")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--steps", type=int, default=2000,
                   help="steps per worker")
    p.add_argument("--batch", type=int, default=64, help="per worker")
    p.add_argument("--lr", type=float, default=0.2,
                   help="BSP: SGD rate after warm-up")
    p.add_argument("--warmup_steps", type=int, default=100)
    p.add_argument("--warmup_from", type=float, default=0.05,
                   help="BSP: SGD rate at step 0")
    p.add_argument("--async_lr", type=float, default=0.05,
                   help="SSP/ASP: the servers' Adagrad rate")
    p.add_argument("--eval_every", type=int, default=50)
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per worker")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data_dir", default=DATA_DIR)
    p.add_argument("--bin_dir", default="bazel-bin",
                   help="holds scheduler/ps_scheduler and server/ps_server")
    p.add_argument("--out_dir", default="out/python_demo")
    p.add_argument("--timeout_s", type=float, default=1200)
    p.add_argument("--worker_index", type=int, default=-1,
                   help=argparse.SUPPRESS)
    p.add_argument("--scheduler", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main() -> int:
    args = parse_args()
    args.out_dir = os.path.abspath(args.out_dir)
    if args.worker_index >= 0:
        run_worker(args)
        return 0
    args.bin_dir = os.path.abspath(args.bin_dir)
    print(f"{args.mode}: {args.workers} PyTorch workers, {args.servers} "
          f"servers, {args.steps} steps of {args.batch} per worker")
    r = run_job(args)
    for seconds, step, accuracy in r["curve"]:
        print(f"  {seconds:7.2f} s  step {step:5d}  test accuracy "
              f"{accuracy:.4f}")
    print(f"{args.mode}: final test accuracy {r['final_accuracy']:.4f}, "
          f"{r['seconds_to_target']:.1f} s to {args.target:.0%}, "
          f"{r['seconds_per_epoch']:.2f} s per epoch "
          f"({r['train_seconds']:.1f} s for {r['epochs']:.2f} epochs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
