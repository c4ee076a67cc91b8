#!/usr/bin/python3
"""Downpour's PyTorch integration against torch DistributedDataParallel.

The same MLP (784-256-10), the same 4 worker processes with the same data
shards, mini-batches (64 per worker) and learning rates, on this machine:

  ddp-sgd      DDP, gloo on 127.0.0.1, torch.optim.SGD with the warm-up
               schedule of the BSP run (0.05 -> 0.2 over 100 steps)
  ddp-adagrad  DDP with torch.optim.Adagrad at the SSP/ASP rate (0.05)
  bsp          Downpour BSP, servers' SGD with the same schedule
  ssp          Downpour SSP (s=3), servers' Adagrad 0.05
  asp          Downpour ASP, servers' Adagrad 0.05

For each: seconds per epoch (training time, process start-up and data
loading excluded) and seconds until rank 0's model first reaches --target
test accuracy (evaluated after the run from snapshots taken every
--eval_every steps, so evaluation costs no training time). Runs alternate
(one of each per round) so that load from elsewhere falls on all of them.

    bazel build //python:downpour //scheduler:ps_scheduler //server:ps_server
    /usr/bin/python3 bench/torch_ddp_bench.py --rounds=3
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python", "examples"))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import downpour  # noqa: E402
import downpour.torch as dpt  # noqa: E402
import fashion_mnist as fm  # noqa: E402

CONFIGS = ["ddp-sgd", "bsp", "ssp", "asp", "ddp-adagrad"]


def run_ddp_worker(args) -> None:
    """One DDP process (rank args.ddp_rank)."""
    torch.set_num_threads(args.threads)
    if args.tune_allocator:
        downpour.tune_allocator()  # the same allocator setting as Downpour's
    rank, world = args.ddp_rank, args.workers
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                            rank=rank, world_size=world)
    torch.manual_seed(args.seed)
    x, y = fm.load_fashion_mnist(args.data_dir, train=True)
    x, y = fm.shard(x, y, rank, world)
    model = torch.nn.parallel.DistributedDataParallel(fm.MLP())
    if args.config == "ddp-sgd":
        rate = dpt.SGD(lr=args.lr, warmup_steps=args.warmup_steps,
                       warmup_from=args.warmup_from).grad_scale
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, rate)
    else:
        opt = torch.optim.Adagrad(model.parameters(), lr=args.async_lr,
                                  initial_accumulator_value=0.1)
        schedule = None
    snapshots = fm.Snapshots()
    dist.barrier()
    start = time.perf_counter()
    source = fm.batches(len(y), args.batch, args.seed, rank)
    for step in range(args.steps):
        if rank == 0 and step % args.eval_every == 0:
            snapshots.take(time.perf_counter() - start, step, model.module)
        idx = next(source)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        if schedule is not None:
            schedule.step()
        opt.zero_grad(set_to_none=True)
    dist.barrier()
    train_seconds = time.perf_counter() - start
    if rank == 0:
        snapshots.take(train_seconds, args.steps, model.module)
        curve = snapshots.evaluate(args.data_dir)
        result = fm.summarize(curve, args.target, train_seconds, args.steps,
                              world, args.batch)
        result.update(mode=args.config, curve=curve)
        with open(os.path.join(args.out_dir, "result.json"), "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ddp(args, config: str, out_dir: str) -> Dict[str, object]:
    os.makedirs(out_dir, exist_ok=True)
    port = free_port()
    procs = []
    for r in range(args.workers):
        argv = [sys.executable, os.path.abspath(__file__), f"--ddp_rank={r}",
                f"--port={port}", f"--config={config}", f"--out_dir={out_dir}"]
        argv += [f"--{k}={v}" for k, v in vars(args).items()
                 if k not in ("ddp_rank", "port", "config", "out_dir")]
        log = open(os.path.join(out_dir, f"ddp-{r}.log"), "wb")
        procs.append((subprocess.Popen(argv, stdout=log,
                                       stderr=subprocess.STDOUT), log))
    failed = None
    deadline = time.monotonic() + args.timeout_s
    for r, (p, log) in enumerate(procs):
        try:
            rc = p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
        log.close()
        if rc != 0:
            failed = failed or f"DDP rank {r} exited with status {rc}"
    if failed:
        raise RuntimeError(f"{failed}; logs in {out_dir}")
    with open(os.path.join(out_dir, "result.json")) as f:
        return json.load(f)


def run_downpour(args, mode: str, out_dir: str) -> Dict[str, object]:
    job = fm.parse_args([
        f"--mode={mode}", f"--staleness={args.staleness}",
        f"--workers={args.workers}", f"--servers={args.servers}",
        f"--steps={args.steps}", f"--batch={args.batch}", f"--lr={args.lr}",
        f"--warmup_steps={args.warmup_steps}",
        f"--warmup_from={args.warmup_from}", f"--async_lr={args.async_lr}",
        f"--eval_every={args.eval_every}", f"--target={args.target}",
        f"--threads={args.threads}", f"--seed={args.seed}",
        f"--data_dir={args.data_dir}", f"--bin_dir={args.bin_dir}",
        f"--out_dir={out_dir}", f"--timeout_s={args.timeout_s}"])
    return fm.run_job(job)


def load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--steps", type=int, default=1200, help="per worker")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--warmup_steps", type=int, default=100)
    p.add_argument("--warmup_from", type=float, default=0.05)
    p.add_argument("--async_lr", type=float, default=0.05)
    p.add_argument("--staleness", type=int, default=3)
    p.add_argument("--eval_every", type=int, default=20)
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tune_allocator", type=int, default=1,
                   help="1: every worker (DDP too) calls "
                        "downpour.tune_allocator()")
    p.add_argument("--data_dir", default=fm.DATA_DIR)
    p.add_argument("--bin_dir", default=os.path.join(ROOT, "bazel-bin"))
    p.add_argument("--out_dir", default=os.path.join(ROOT, "out", "ddp_bench"))
    p.add_argument("--timeout_s", type=float, default=1200)
    p.add_argument("--ddp_rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--config", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.ddp_rank >= 0:
        run_ddp_worker(args)
        return 0

    configs = args.configs.split(",")
    results: Dict[str, List[Dict[str, object]]] = {c: [] for c in configs}
    for rnd in range(args.rounds):
        for config in configs:
            out_dir = os.path.join(args.out_dir, f"{config}-{rnd}")
            before = load_average()
            if config.startswith("ddp"):
                r = run_ddp(args, config, out_dir)
            else:
                r = run_downpour(args, config, out_dir)
            r["load_before"] = before
            results[config].append(r)
            print(f"round {rnd} {config:12s} {r['seconds_per_epoch']:6.2f} s/epoch"
                  f"  {r['seconds_to_target']:6.1f} s to {args.target:.0%}"
                  f"  final {r['final_accuracy']:.4f}  (load {before})",
                  flush=True)
    with open(os.path.join(args.out_dir, "results.json"), "w") as f:
        json.dump(results, f)

    base = "ddp-sgd" if "ddp-sgd" in results else configs[0]
    base_epoch = statistics.median(r["seconds_per_epoch"]
                                   for r in results[base])
    base_target = [r["seconds_to_target"] for r in results[base]
                   if r["seconds_to_target"] > 0]
    print(f"\nmedians over {args.rounds} round(s); ratios against {base}")
    print("| run | s/epoch | vs DDP | s to {:.0%} | vs DDP | final accuracy |"
          .format(args.target))
    print("| --- | --- | --- | --- | --- | --- |")
    for config in configs:
        rs = results[config]
        epoch = statistics.median(r["seconds_per_epoch"] for r in rs)
        reached = [r["seconds_to_target"] for r in rs
                   if r["seconds_to_target"] > 0]
        target = statistics.median(reached) if reached else float("nan")
        ratio_t = (target / statistics.median(base_target)
                   if reached and base_target else float("nan"))
        final = statistics.median(r["final_accuracy"] for r in rs)
        print(f"| {config} | {epoch:.2f} | {epoch / base_epoch:.2f} | "
              f"{target:.1f} ({len(reached)}/{len(rs)}) | {ratio_t:.2f} | "
              f"{final:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
