#!/usr/bin/python3
"""DLRM on synthetic Criteo-shaped click logs: Downpour against what users
run today, with the same data, model, optimizer and batch size.

  torch   one PyTorch process: 26 nn.EmbeddingBag(sparse=True) and
          torch.optim.Adagrad (sparse for the tables): the accuracy
          reference
  torch-fused  one process, one nn.Embedding(sparse=True) holding all 26
          fields at offsets (TorchRec's fused layout): a faster baseline
  ddp     DistributedDataParallel, gloo on 127.0.0.1, every worker holding
          the whole tables (their sparse gradients all-reduced)
  bsp     Downpour, every table BSP (python/examples/dlrm.py --mode=bsp)
  hybrid  Downpour, the MLPs BSP and the embedding table ASP
  asp     Downpour, every table ASP (not in the default set)

A distributed config with "-split" (ddp-split, bsp-split, ...) divides
--batch over its workers instead of giving each worker --batch rows: each
step's global batch is then the single process's, and a synchronous run
makes as many updates as it does (rank r's rows of a step are rows r,
r + N, ... of the single process's batch), as DDP users do to keep the
optimizer's batch when they add workers.

Every run trains on the same generator's rows (rank r of N takes rows r,
r + N, ...), --batch rows per worker and step, Adagrad (--lr for the MLPs,
--emb_lr for the tables), until --examples examples in all; rank 0's model
is snapshotted every --eval_every examples and judged after the run on
--eval_rows held-out rows (AUC, log loss), so the curves compare at equal
examples seen. Throughput: examples of all workers over the wall time from
the first worker's start to the last one's end (start-up and evaluation
excluded). Peak RSS: every worker's, and the servers'. Runs alternate (one
of each config per round) so that load from elsewhere falls on all.

    bazel build //python:downpour //scheduler:ps_scheduler //server:ps_server
    /usr/bin/python3 bench/dlrm_bench.py --rounds=2             # this machine
    /usr/bin/python3 bench/dlrm_bench.py --configs=bsp,hybrid \\
        --workers=1,2,4,8 --servers=4 --rounds=1                 # scaling
    /usr/bin/python3 bench/dlrm_bench.py --configs=torch,hybrid \\
        --scale=1 --examples=102400 --rounds=1                   # memory

It writes out_dir/results.json, out_dir/curve.csv and out_dir/dlrm.png
(the last round's curves).
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
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python", "examples"))
sys.path.insert(0, os.path.join(ROOT, "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import dlrm  # noqa: E402
import downpour  # noqa: E402
from downpour import clicklog  # noqa: E402

DOWNPOUR_CONFIGS = ("bsp", "hybrid", "asp", "ssp")
SPLIT = "-split"


def base_config(config: str) -> str:
    """The config without its "-split"."""
    return config[:-len(SPLIT)] if config.endswith(SPLIT) else config


def per_worker_batch(args, config: str, workers: int) -> int:
    """Rows per worker and step: --batch, or --batch over the workers for a
    "-split" config (main checks that they divide it)."""
    return args.batch // workers if config.endswith(SPLIT) else args.batch


# -- the PyTorch baselines --------------------------------------------------------

def initial_rows(field: int, n: int, seed: int) -> torch.Tensor:
    """Rows 0..n-1 of `field` as the Downpour table's initializer makes them
    (dlrm.py's FieldEmbedding), so that every run starts from the same
    values."""
    keys = clicklog.feature_keys(np.arange(n, dtype=np.int64), field)
    return torch.from_numpy(downpour.initial_rows(
        keys, dlrm.DIM, init="uniform", init_a=-dlrm.INIT_RANGE,
        init_b=dlrm.INIT_RANGE, init_seed=seed))


class TorchFieldEmbedding(torch.nn.Module):
    """26 nn.EmbeddingBag(sparse=True), one per field: what a PyTorch user
    writes (forward as FieldEmbedding's), starting from the Downpour
    table's initial rows."""

    def __init__(self, cardinalities, seed: int):
        super().__init__()
        self.tables = torch.nn.ModuleList(
            torch.nn.EmbeddingBag(n, dlrm.DIM, mode="sum", sparse=True)
            for n in cardinalities)
        with torch.no_grad():
            for f, t in enumerate(self.tables):
                t.weight.copy_(initial_rows(f, t.num_embeddings, seed))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.stack([t(ids[:, f:f + 1]) for f, t in
                            enumerate(self.tables)], 1)

    def rows_of(self, fields: np.ndarray, ids: np.ndarray) -> torch.Tensor:
        """Rows of (field, id) pairs, [len(ids), dim]."""
        out = torch.empty(len(ids), self.tables[0].embedding_dim)
        with torch.no_grad():
            for f, t in enumerate(self.tables):
                sel = np.nonzero(fields == f)[0]
                if len(sel):
                    out[torch.from_numpy(sel)] = t.weight[
                        torch.from_numpy(ids[sel])]
        return out


class TorchFusedEmbedding(torch.nn.Module):
    """One nn.Embedding(sparse=True) holding every field's rows at an offset
    (TorchRec's fused layout): one lookup and one sparse gradient per step
    instead of 26. A stronger single-process baseline than the 26 bags."""

    def __init__(self, cardinalities, seed: int):
        super().__init__()
        offsets = np.concatenate([[0], np.cumsum(cardinalities)[:-1]])
        self.register_buffer("offsets", torch.from_numpy(offsets),
                             persistent=False)
        self.table = torch.nn.Embedding(int(sum(cardinalities)), dlrm.DIM,
                                        sparse=True)
        with torch.no_grad():
            for f, n in enumerate(cardinalities):
                self.table.weight[offsets[f]:offsets[f] + n] = initial_rows(
                    f, n, seed)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table(ids + self.offsets)

    def rows_of(self, fields: np.ndarray, ids: np.ndarray) -> torch.Tensor:
        index = torch.from_numpy(ids + self.offsets.numpy()[fields])
        with torch.no_grad():
            return self.table.weight[index].clone()


def torch_worker(args, rank: int, world: int) -> Dict[str, object]:
    """Trains the PyTorch model (wrapped in DDP when world > 1); returns
    this rank's result (rank 0's with its curve)."""
    torch.set_num_threads(args.threads)
    downpour.tune_allocator()  # the same allocator setting as Downpour's
    gen = clicklog.Generator(seed=args.seed, scale=args.scale)
    layer = (TorchFusedEmbedding if args.child_kind == "torch-fused"
             else TorchFieldEmbedding)
    emb = layer(gen.cardinalities, args.seed)
    net = dlrm.build(emb, args.seed)
    model = net
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.Adagrad(
        [{"params": list(emb.parameters()), "lr": args.emb_lr},
         {"params": list(net.bottom.parameters()) +
          list(net.top.parameters()), "lr": args.lr}],
        initial_accumulator_value=args.initial_accumulator, eps=1e-8)
    steps = args.examples // (world * args.batch)
    eval_set = dlrm.EvalSet(gen, args.eval_rows) if rank == 0 else None
    snapshots = dlrm.Snapshots()
    points = dlrm.eval_points(steps * world * args.batch, args.eval_every)
    if world > 1:
        dist.barrier()
    start = time.time()
    examples = 0
    for step, b in enumerate(gen.stream(rank, world, args.batch,
                                        batches=steps)):
        seen = step * world * args.batch
        if rank == 0 and points and seen >= points[0]:
            points.pop(0)
            snapshots.take(time.time() - start, seen, net,
                           emb.rows_of(eval_set.fields, eval_set.ids))
        logits = model(torch.from_numpy(b.dense),
                       torch.from_numpy(b.categorical))
        loss = F.binary_cross_entropy_with_logits(logits,
                                                  torch.from_numpy(b.labels))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        examples += len(b)
    if world > 1:
        dist.barrier()
    end = time.time()
    result = {"rank": rank, "examples": examples, "start": start, "end": end,
              "peak_rss_mb": dlrm.peak_rss_mb()}
    if rank == 0:
        snapshots.take(end - start, steps * world * args.batch, net,
                       emb.rows_of(eval_set.fields, eval_set.ids))
        result["curve"] = snapshots.evaluate(eval_set)
    return result


def child_main(args) -> None:
    """A baseline process: the single one (--child_rank=0, world 1) or a
    DDP rank."""
    world = args.child_world
    if world > 1:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{args.port}",
            rank=args.child_rank, world_size=world)
    result = torch_worker(args, args.child_rank, world)
    with open(os.path.join(args.out_dir,
                           f"result-{args.child_rank}.json"), "w") as f:
        json.dump(result, f)
    if world > 1:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torch(args, kind: str, world: int, out_dir: str,
              batch: int) -> Dict[str, object]:
    """The single process (world 1) or DDP with `world` ranks of `batch`
    rows a step; kind "torch-fused" for the fused table."""
    os.makedirs(out_dir, exist_ok=True)
    port = free_port()
    procs = []
    for r in range(world):
        argv = [sys.executable, os.path.abspath(__file__),
                f"--child_rank={r}", f"--child_world={world}",
                f"--port={port}", f"--out_dir={out_dir}",
                f"--child_kind={kind}", f"--batch={batch}"]
        argv += [f"--{k}={v}" for k, v in vars(args).items()
                 if k not in ("child_rank", "child_world", "port", "out_dir",
                              "workers", "configs", "child_kind", "batch")]
        log = open(os.path.join(out_dir, f"rank-{r}.log"), "wb")
        procs.append((subprocess.Popen(argv, stdout=log,
                                       stderr=subprocess.STDOUT), log))
    deadline = time.monotonic() + args.timeout_s
    failed = None
    for r, (p, log) in enumerate(procs):
        try:
            rc = p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
        log.close()
        if rc != 0:
            failed = failed or f"rank {r} exited with status {rc}"
    if failed:
        raise RuntimeError(f"{failed}; logs in {out_dir}")
    results = []
    for r in range(world):
        with open(os.path.join(out_dir, f"result-{r}.json")) as f:
            results.append(json.load(f))
    examples = sum(r["examples"] for r in results)
    seconds = max(r["end"] for r in results) - min(r["start"] for r in results)
    return {"examples": examples, "seconds": seconds,
            "examples_per_s": examples / seconds,
            "curve": results[0]["curve"],
            "worker_peak_rss_mb": [r["peak_rss_mb"] for r in results],
            "server_peak_rss_mb": []}


def run_downpour(args, mode: str, workers: int, out_dir: str,
                 batch: int) -> Dict[str, object]:
    # A -split step's rows are the single process's batch: the mean of the
    # workers' gradients is then its gradient, for the tables too.
    reduce = "mean" if batch != args.batch else args.emb_bsp_reduce
    job = dlrm.parse_args([
        f"--mode={mode}", f"--workers={workers}",
        f"--servers={args.servers}",
        f"--steps={args.examples // (workers * batch)}",
        f"--batch={batch}", f"--scale={args.scale}", f"--lr={args.lr}",
        f"--emb_lr={args.emb_lr}", f"--prefetch={args.prefetch}",
        f"--initial_accumulator={args.initial_accumulator}",
        f"--emb_bsp_reduce={reduce}",
        f"--eval_every={args.eval_every}", f"--eval_rows={args.eval_rows}",
        f"--threads={args.threads}", f"--seed={args.seed}",
        f"--staleness={args.staleness}", f"--progress={args.progress}",
        f"--bin_dir={args.bin_dir}", f"--out_dir={out_dir}",
        f"--timeout_s={args.timeout_s}"])
    return dlrm.run_job(job)


# -- rounds and the report ------------------------------------------------------

def load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def auc_at(curve: List[Dict[str, float]], examples: int) -> Optional[float]:
    for p in curve:
        if p["examples"] == examples:
            return p["auc"]
    return None


def summarize(args, runs: Dict[str, List[Dict[str, object]]],
              planted: Dict[str, float]) -> str:
    lines = [f"{'config':<14} {'examples/s':>22} {'AUC':>8} {'log loss':>9} "
             f"{'AUC - torch':>11} {'worker RSS MB':>14} {'server RSS MB':>14}"]
    reference = None
    if "torch" in runs:
        reference = statistics.median(r["curve"][-1]["auc"]
                                      for r in runs["torch"])
    for label, rs in runs.items():
        rates = [r["examples_per_s"] for r in rs]
        aucs = [r["curve"][-1]["auc"] for r in rs]
        losses = [r["curve"][-1]["log_loss"] for r in rs]
        rate = statistics.median(rates)
        spread = f"{min(rates):,.0f}-{max(rates):,.0f}"
        auc = statistics.median(aucs)
        delta = f"{auc - reference:+.4f}" if reference is not None else "-"
        wrss = max(max(r["worker_peak_rss_mb"]) for r in rs)
        srss = max(max(r["server_peak_rss_mb"] or [0]) for r in rs)
        lines.append(f"{label:<14} {rate:>9,.0f} ({spread:>11}) {auc:>8.4f} "
                     f"{statistics.median(losses):>9.4f} {delta:>11} "
                     f"{wrss:>14.0f} {srss:>14.0f}")
    lines.append(f"best achievable (planted model): AUC {planted['auc']:.4f}, "
                 f"log loss {planted['log_loss']:.4f}")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default="torch,torch-fused,ddp,bsp,hybrid",
                   help="comma-separated: torch, torch-fused, ddp, bsp, hybrid, asp, "
                        "ssp; a distributed one with -split divides --batch "
                        "over its workers")
    p.add_argument("--workers", default="4",
                   help="worker counts (comma-separated) for ddp and Downpour")
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--examples", type=int, default=409600,
                   help="examples per run, all workers together")
    p.add_argument("--batch", type=int, default=256,
                   help="per worker (a -split config: per step, all workers)")
    p.add_argument("--scale", type=float, default=0.01,
                   help="table sizes as a fraction of Criteo's")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--emb_lr", type=float, default=0.05)
    p.add_argument("--initial_accumulator", type=float, default=1e-4,
                   help="Adagrad's starting sum of squares, every run")
    p.add_argument("--emb_bsp_reduce", default="sum", choices=["sum", "mean"],
                   help="BSP tables: the sum of the workers' gradients of a "
                        "row (TorchRec's) or their mean (DDP's); -split "
                        "configs always take the mean")
    p.add_argument("--prefetch", type=int, default=1)
    p.add_argument("--staleness", type=int, default=2)
    p.add_argument("--eval_every", type=int, default=102400)
    p.add_argument("--eval_rows", type=int, default=50000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--progress", type=int, default=1)
    p.add_argument("--bin_dir", default=os.path.join(ROOT, "bazel-bin"))
    p.add_argument("--out_dir", default=os.path.join(ROOT, "out",
                                                     "dlrm_bench"))
    p.add_argument("--timeout_s", type=float, default=900)
    p.add_argument("--child_rank", type=int, default=-1,
                   help=argparse.SUPPRESS)
    p.add_argument("--child_world", type=int, default=1,
                   help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--child_kind", default="torch", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main() -> int:
    args = parse_args()
    if args.child_rank >= 0:
        child_main(args)
        return 0
    args.out_dir = os.path.abspath(args.out_dir)
    args.bin_dir = os.path.abspath(args.bin_dir)
    configs = [c for c in args.configs.split(",") if c]
    worker_counts = [int(w) for w in args.workers.split(",") if w]
    for c in configs:
        base = base_config(c)
        known = base in ("torch", "torch-fused", "ddp") + DOWNPOUR_CONFIGS
        if not known or (base != c and base in ("torch", "torch-fused")):
            print(f"unknown config {c!r}", file=sys.stderr)
            return 2
        for w in (worker_counts if base != c else []):
            if args.batch % w:
                print(f"{c}: --batch={args.batch} does not divide over {w} "
                      "workers", file=sys.stderr)
                return 2
    print(f"DLRM (dim {dlrm.DIM}, bottom 13-64-16, top 367-64-1), batch "
          f"{args.batch} per worker (per step for -split configs), "
          f"{args.examples:,} examples per run, "
          f"tables at {args.scale:g} of Criteo's sizes, {args.servers} "
          f"servers; {os.cpu_count()} cores; load {load_average()}")
    runs: Dict[str, List[Dict[str, object]]] = {}
    last_curves: Dict[str, List[Dict[str, float]]] = {}
    for rnd in range(args.rounds):
        for config in configs:
            single = config in ("torch", "torch-fused")
            counts = [1] if single else worker_counts
            for workers in counts:
                batch = per_worker_batch(args, config, workers)
                base = base_config(config)
                label = config if single else f"{base}-{workers}w"
                if base != config:
                    label += f"-b{batch}"
                out_dir = os.path.join(args.out_dir, f"{label}-r{rnd}")
                t0 = time.monotonic()
                if single:
                    r = run_torch(args, config, 1, out_dir, batch)
                elif base == "ddp":
                    r = run_torch(args, base, workers, out_dir, batch)
                else:
                    r = run_downpour(args, base, workers, out_dir, batch)
                r.update(label=label, round=rnd, load=load_average())
                runs.setdefault(label, []).append(r)
                last_curves[label] = r["curve"]
                final = r["curve"][-1]
                print(f"round {rnd} {label:<12} {r['examples_per_s']:9,.0f} "
                      f"examples/s  AUC {final['auc']:.4f}  log loss "
                      f"{final['log_loss']:.4f}  worker RSS "
                      f"{max(r['worker_peak_rss_mb']):.0f} MB  "
                      f"({time.monotonic() - t0:.0f} s, load {r['load']})",
                      flush=True)
    planted = clicklog.Generator(seed=args.seed,
                                 scale=args.scale).planted(args.eval_rows)
    report = summarize(args, runs, planted)
    print("\nmedians over rounds (examples/s with the range):")
    print(report)
    # AUC at every snapshot, for "at equal examples seen".
    points = sorted({p["examples"] for rs in runs.values()
                     for r in rs for p in r["curve"]})
    print("\nAUC by examples seen (median over rounds):")
    print(f"{'examples':>10} " + " ".join(f"{l:>12}" for l in runs))
    for e in points:
        cells = []
        for rs in runs.values():
            vals = [a for a in (auc_at(r["curve"], e) for r in rs)
                    if a is not None]
            cells.append(f"{statistics.median(vals):>12.4f}" if vals
                         else f"{'-':>12}")
        print(f"{e:>10,} " + " ".join(cells))
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "results.json"), "w") as f:
        json.dump({"args": vars(args), "planted": planted, "runs": runs}, f,
                  indent=1)
    png = dlrm.write_curves(args.out_dir, last_curves, planted,
                            title="DLRM: PyTorch, DDP and Downpour")
    print(f"\nresults: {os.path.join(args.out_dir, 'results.json')}"
          + (f", plot: {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
