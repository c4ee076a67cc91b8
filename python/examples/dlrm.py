#!/usr/bin/python3
"""Trains a DLRM-style click model on synthetic Criteo-shaped click logs with
PyTorch and Downpour: a scheduler, servers and N worker processes on
127.0.0.1, each worker a plain PyTorch loop around
downpour.torch.DistributedModel (the MLPs) and downpour.torch.FieldEmbedding
(the 26 categorical fields, one sparse table on the servers).

    bazel build //python:downpour //scheduler:ps_scheduler //server:ps_server
    /usr/bin/python3 python/examples/dlrm.py                  # hybrid
    /usr/bin/python3 python/examples/dlrm.py --mode=bsp --workers=4

Modes: bsp, ssp (--staleness), asp: the job's policy for every table;
hybrid: the MLPs under BSP (bit for bit the same on every worker) while the
embedding table runs ASP (``consistency="asp"``).

The model (DLRM, Naumov et al. 2019): dense features through a bottom MLP
13-64-16, each categorical field through an embedding of dimension 16,
pairwise dot products of those 27 vectors, then a top MLP (367-64-1) to
one logit. Adagrad on the servers for both (--emb_optimizer=rowwise_adagrad
for TorchRec's row-wise variant), its sums of squares starting at
--initial_accumulator (1e-4): from 0, a coordinate's first step is
lr * sign(g) however small g is, so rows whose gradient is near 0 move by
the full rate in the direction float rounding picks, and two runs of the
same arithmetic in another order drift apart (docs/BENCHMARKS.md). Data: downpour.clicklog's generator at
--scale of Criteo's table sizes; rank r trains on rows r, r + N, ...

It prints a live progress line, then held-out AUC and log loss (rank 0's
model at every --eval_every examples, on --eval_rows held-out rows,
evaluated after training from snapshots so that evaluation costs the job
little) next to the planted model's (the best achievable), and writes
out_dir/curve.csv and out_dir/dlrm.png (gnuplot). bench/dlrm_bench.py
reuses these pieces.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

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
from downpour import clicklog  # noqa: E402
from downpour.local_cluster import LocalCluster  # noqa: E402

DIM = 16
FIELDS = clicklog.NUM_CATEGORICAL


# -- the model (shared with bench/dlrm_bench.py) --------------------------------

def mlp(sizes: Sequence[int], relu_last: bool) -> torch.nn.Sequential:
    layers: List[torch.nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(sizes) - 2 or relu_last:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class DLRM(torch.nn.Module):
    """Bottom MLP 13-64-16, `embedding` ([B, 26] ids -> [B, 26, 16]),
    pairwise dots of the 27 vectors, top MLP (16 + 351)-64-1."""

    def __init__(self, embedding: Optional[torch.nn.Module],
                 bottom: Sequence[int] = (clicklog.NUM_DENSE, 64, DIM),
                 top: Sequence[int] = (64, 1)):
        super().__init__()
        self.embedding = embedding
        self.bottom = mlp(bottom, relu_last=True)
        vectors = FIELDS + 1
        pairs = vectors * (vectors - 1) // 2
        self.top = mlp((bottom[-1] + pairs,) + tuple(top), relu_last=False)
        # The pairs below the diagonal of the 27 x 27 dot products, as
        # positions in the flattened matrix: index_select's backward is an
        # index_add, 1.4x faster here than advanced indexing's.
        li, lj = torch.tril_indices(vectors, vectors, offset=-1)
        self.register_buffer("_pairs", li * vectors + lj, persistent=False)

    def forward(self, dense: torch.Tensor,
                categorical: torch.Tensor) -> torch.Tensor:
        return self.predict(dense, self.embedding(categorical))

    def predict(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """Logits from dense features and the fields' vectors [B, 26, D]."""
        x = self.bottom(dense)
        t = torch.cat([x.unsqueeze(1), emb], 1)
        z = torch.bmm(t, t.transpose(1, 2)).flatten(1).index_select(
            1, self._pairs)
        return self.top(torch.cat([x, z], 1)).squeeze(1)

    def dense_state(self) -> Dict[str, torch.Tensor]:
        """A copy of the MLPs' parameters (not the embedding's)."""
        return {k: v.detach().clone() for k, v in self.state_dict().items()
                if not k.startswith("embedding.")}


# Embedding rows start uniform in [-r, r) (one r for every field, as the
# Downpour table has one initializer): the table's initializer, a pure
# function of (seed, key, column), which the PyTorch baselines of
# bench/dlrm_bench.py copy (downpour.initial_rows) so that every run starts
# from the same values.
INIT_RANGE = 0.05


def build(embedding: Optional[torch.nn.Module], seed: int) -> DLRM:
    """The DLRM with MLPs initialized from `seed` alone (the same in every
    configuration, whatever the embedding's construction draws)."""
    torch.manual_seed(seed)
    net = DLRM(None)
    net.embedding = embedding
    return net


class EvalSet:
    """Held-out rows and their distinct (field, id) keys: a model is judged
    from its MLPs' state and the rows of those keys, [U, 16]."""

    def __init__(self, gen: clicklog.Generator, rows: int):
        b = gen.held_out(rows)
        self.dense = torch.from_numpy(b.dense)
        self.labels = b.labels
        keys = clicklog.feature_keys(b.categorical, range(FIELDS))
        self.keys, first, inverse = np.unique(
            keys.reshape(-1), return_index=True, return_inverse=True)
        self.inverse = torch.from_numpy(inverse.reshape(-1, FIELDS))
        self.fields = (first % FIELDS).astype(np.int64)
        self.ids = b.categorical.reshape(-1)[first]

    def evaluate(self, state: Dict[str, torch.Tensor], rows: torch.Tensor,
                 chunk: int = 8192) -> Tuple[float, float]:
        """(AUC, log loss) of the model with MLP `state` and rows `rows`."""
        model = DLRM(None)
        model.load_state_dict(state)
        logits = []
        with torch.no_grad():
            for b in range(0, len(self.labels), chunk):
                emb = F.embedding(self.inverse[b:b + chunk], rows)
                logits.append(model.predict(self.dense[b:b + chunk], emb))
        p = torch.sigmoid(torch.cat(logits)).numpy().astype(np.float32)
        return clicklog.auc(p, self.labels), clicklog.log_loss(p, self.labels)


class Snapshots:
    """Rank 0's model at chosen points: (seconds, examples, MLP state, eval
    rows), evaluated after training."""

    def __init__(self):
        self.items: List[Tuple[float, int, Dict[str, torch.Tensor],
                               torch.Tensor]] = []

    def take(self, seconds: float, examples: int, model: DLRM,
             rows: torch.Tensor) -> None:
        self.items.append((seconds, examples, model.dense_state(), rows))

    def evaluate(self, eval_set: EvalSet) -> List[Dict[str, float]]:
        curve = []
        for seconds, examples, state, rows in self.items:
            auc, loss = eval_set.evaluate(state, rows)
            curve.append({"seconds": seconds, "examples": examples,
                          "auc": auc, "log_loss": loss})
        return curve


def peak_rss_mb() -> float:
    """This process's peak resident set (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def eval_points(total_examples: int, every: int) -> List[int]:
    """Example counts at which rank 0 snapshots: multiples of `every`."""
    return list(range(0, total_examples, every)) if every > 0 else [0]


class Progress:
    """A worker's progress file, rewritten about once a second (the launcher
    reads them for its progress line)."""

    def __init__(self, path: str):
        self.path = path
        self.last = 0.0
        self.loss = None

    def update(self, examples: int, loss: float, force: bool = False):
        self.loss = loss if self.loss is None else 0.98 * self.loss + 0.02 * loss
        now = time.monotonic()
        if force or now - self.last >= 1.0:
            self.last = now
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"examples": examples, "loss": self.loss}, f)
            os.replace(tmp, self.path)


# -- one Downpour worker --------------------------------------------------------

def emb_optimizer(args) -> dpt.ServerOptimizer:
    if args.emb_optimizer == "rowwise_adagrad":
        return dpt.RowwiseAdagrad(lr=args.emb_lr)
    return dpt.Adagrad(lr=args.emb_lr,
                       initial_accumulator=args.initial_accumulator)


def run_worker(args) -> None:
    torch.set_num_threads(args.threads)
    downpour.tune_allocator()
    member = downpour.JobMember.join(args.scheduler,
                                     name=f"worker-{args.worker_index}")
    client = downpour.Client.connect(args.scheduler, op_timeout=120)
    rank, total = member.rank, member.policy.total_workers
    gen = clicklog.Generator(seed=args.seed, scale=args.scale)
    emb = dpt.FieldEmbedding(
        FIELDS, DIM, client=client, name="dlrm/emb",
        optimizer=emb_optimizer(args), init="uniform", init_a=-INIT_RANGE,
        init_b=INIT_RANGE, init_seed=args.seed,
        consistency="asp" if args.mode == "hybrid" else None,
        bsp_reduce=args.emb_bsp_reduce)
    net = build(emb, args.seed)  # rank 0's MLPs are the ones used
    model = dpt.DistributedModel(
        net, client, member, name="dlrm",
        optimizer=dpt.Adagrad(lr=args.lr,
                              initial_accumulator=args.initial_accumulator))
    eval_set = EvalSet(gen, args.eval_rows) if rank == 0 else None
    snapshots = Snapshots()
    points = eval_points(args.steps * total * args.batch, args.eval_every)
    progress = Progress(os.path.join(args.out_dir, f"progress-{rank}.json"))
    batches = gen.stream(rank, total, args.batch, batches=args.steps)
    if args.prefetch:
        batches = dpt.prefetch_loader(
            batches,
            lambda b: emb.prefetch(torch.from_numpy(b.categorical)))
    start = time.time()
    examples = 0
    for step, b in enumerate(batches):
        seen = step * total * args.batch  # by all workers, about
        if rank == 0 and points and seen >= points[0]:
            points.pop(0)
            model.refresh()
            snapshots.take(time.time() - start, seen, net,
                           emb.rows_of_keys(eval_set.keys))
        logits = model(torch.from_numpy(b.dense),
                       torch.from_numpy(b.categorical))
        loss = F.binary_cross_entropy_with_logits(logits,
                                                  torch.from_numpy(b.labels))
        loss.backward()
        model.step(loss.item(), examples=len(b))
        examples += len(b)
        progress.update(examples, loss.item())
    model.finish()
    end = time.time()
    progress.update(examples, progress.loss or 0.0, force=True)
    # The last snapshot is of the job's model once every worker's steps have
    # landed (under SSP and ASP rank 0 may finish ahead of the others).
    member.barrier("trained", timeout=args.timeout_s)
    if rank == 0:
        model.pull()
    member.leave(finished=True)
    result = {"rank": rank, "examples": examples, "start": start, "end": end,
              "peak_rss_mb": peak_rss_mb(), "embedding": emb.stats(),
              "dense": model.stats()}
    if rank == 0:
        snapshots.take(end - start, args.steps * total * args.batch, net,
                       emb.rows_of_keys(eval_set.keys))
        result["curve"] = snapshots.evaluate(eval_set)
    with open(os.path.join(args.out_dir, f"result-{rank}.json"), "w") as f:
        json.dump(result, f)
    client.close()


# -- the job: daemons, worker processes, the progress line ---------------------

def scheduler_flags(mode: str, workers: int, staleness: int) -> List[str]:
    policy = "bsp" if mode == "hybrid" else mode
    flags = [f"--consistency={policy}", f"--num_workers={workers}"]
    if mode == "ssp":
        flags.append(f"--staleness={staleness}")
    return flags


def _proc_peak_rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def _show_progress(args, start: float, final: bool = False) -> None:
    examples, losses = 0, []
    for i in range(args.workers):
        try:
            with open(os.path.join(args.out_dir, f"progress-{i}.json")) as f:
                p = json.load(f)
            examples += p["examples"]
            if p["loss"] is not None:
                losses.append(p["loss"])
        except (OSError, ValueError):
            pass
    seconds = time.monotonic() - start
    total = args.steps * args.workers * args.batch
    line = (f"{args.mode}: {examples:,}/{total:,} examples, "
            f"{examples / max(seconds, 1e-9):,.0f} examples/s, train loss "
            f"{np.mean(losses) if losses else float('nan'):.4f}, "
            f"{seconds:.0f} s")
    if sys.stdout.isatty():
        print("\r" + line + " " * 8, end="\n" if final else "", flush=True)
    elif final or int(seconds) % 10 == 0:
        print(line, flush=True)


def run_job(args) -> Dict[str, object]:
    """Starts the cluster and the workers, waits for them; returns the
    combined result (examples/s over all workers, rank 0's curve, peak
    RSS of every worker and server)."""
    os.makedirs(args.out_dir, exist_ok=True)
    for name in os.listdir(args.out_dir):
        if name.startswith(("result-", "progress-")):
            os.remove(os.path.join(args.out_dir, name))
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
        start = time.monotonic()
        deadline = start + args.timeout_s
        failed = None
        last_shown = 0.0
        while any(p.poll() is None for p, _ in procs):
            if time.monotonic() > deadline:
                failed = "the job timed out"
                break
            if args.progress and time.monotonic() - last_shown >= 1.0:
                _show_progress(args, start)
                last_shown = time.monotonic()
            time.sleep(0.1)
        server_rss = [_proc_peak_rss_mb(pid) for pid in cluster.server_pids()]
        for i, (p, log) in enumerate(procs):
            if p.poll() is None:
                p.kill()
            rc = p.wait()
            log.close()
            if rc != 0:
                failed = failed or f"worker {i} exited with status {rc}"
        if failed:
            for i in range(args.workers):
                print(f"--- worker-{i}.log (tail)", file=sys.stderr)
                print(cluster.log_tail(f"worker-{i}.log", 3000),
                      file=sys.stderr)
            raise RuntimeError(failed)
    if args.progress:
        _show_progress(args, start, final=True)
    results = []
    for i in range(args.workers):
        with open(os.path.join(args.out_dir, f"result-{i}.json")) as f:
            results.append(json.load(f))
    examples = sum(r["examples"] for r in results)
    seconds = max(r["end"] for r in results) - min(r["start"] for r in results)
    rank0 = next(r for r in results if r["rank"] == 0)
    return {"mode": args.mode, "workers": args.workers,
            "servers": args.servers, "examples": examples,
            "seconds": seconds, "examples_per_s": examples / seconds,
            "curve": rank0["curve"],
            "worker_peak_rss_mb": [r["peak_rss_mb"] for r in results],
            "server_peak_rss_mb": server_rss,
            "embedding": rank0["embedding"]}


def write_curves(out_dir: str, curves: Dict[str, List[Dict[str, float]]],
                 planted: Optional[Dict[str, float]] = None,
                 title: str = "DLRM on synthetic Criteo-shaped clicks") -> str:
    """curve.csv (label, seconds, examples, auc, log_loss) and dlrm.png: AUC
    and log loss against examples seen and against time. Returns the PNG's
    path, or "" when gnuplot failed."""
    path = os.path.join(out_dir, "curve.csv")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["label", "seconds", "examples", "auc", "log_loss"])
        for label, curve in curves.items():
            for p in curve:
                w.writerow([label, f"{p['seconds']:.3f}", p["examples"],
                            f"{p['auc']:.5f}", f"{p['log_loss']:.5f}"])
    png = os.path.join(out_dir, "dlrm.png")
    script = os.path.join(out_dir, "plot.gp")
    best = ""
    if planted:
        best = (f"; best achievable AUC {planted['auc']:.4f}, log loss "
                f"{planted['log_loss']:.4f}")

    def series(xcol: int, ycol: int) -> str:
        return ", ".join(
            f"'< grep \"^{label},\" {path}' using {xcol}:{ycol} with "
            f"linespoints lw 2 title '{label}'" for label in curves)

    # The untrained first snapshot is left off the scale: the curves' later
    # part is where the runs differ.
    later = [p for c in curves.values() for p in c[1:]] or \
        [p for c in curves.values() for p in c]
    auc_range = f"[{min(p['auc'] for p in later) - 0.005:.4f}:*]"
    loss_range = f"[*:{max(p['log_loss'] for p in later) + 0.005:.4f}]"
    with open(script, "w") as f:
        f.write(f"set terminal pngcairo size 1400,900\nset output '{png}'\n"
                "set datafile separator ','\nset grid\nset key bottom right\n"
                f"set multiplot layout 2,2 title '{title}{best}'\n"
                "set xlabel 'examples seen'\nset ylabel 'held-out AUC'\n"
                f"set yrange {auc_range}\nplot {series(3, 4)}\n"
                "set ylabel 'held-out log loss'\nset key top right\n"
                f"set yrange {loss_range}\nplot {series(3, 5)}\n"
                "set xlabel 'seconds'\nset ylabel 'held-out AUC'\n"
                f"set key bottom right\nset yrange {auc_range}\n"
                f"plot {series(2, 4)}\n"
                "set ylabel 'held-out log loss'\nset key top right\n"
                f"set yrange {loss_range}\nplot {series(2, 5)}\n"
                "unset multiplot\n")
    try:
        ok = subprocess.run(["gnuplot", script], capture_output=True,
                            check=False).returncode == 0
    except OSError:
        ok = False
    return png if ok else ""


def parse_args(argv: Optional[List[str]] = None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", default="hybrid",
                   choices=["bsp", "ssp", "asp", "hybrid"])
    p.add_argument("--staleness", type=int, default=2, help="SSP bound")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--steps", type=int, default=500,
                   help="steps per worker")
    p.add_argument("--batch", type=int, default=256, help="per worker")
    p.add_argument("--scale", type=float, default=0.01,
                   help="table sizes as a fraction of Criteo's")
    p.add_argument("--lr", type=float, default=0.05,
                   help="the MLPs' Adagrad rate (on the servers)")
    p.add_argument("--emb_lr", type=float, default=0.05,
                   help="the embedding table's Adagrad rate")
    p.add_argument("--emb_optimizer", default="adagrad",
                   choices=["adagrad", "rowwise_adagrad"])
    p.add_argument("--initial_accumulator", type=float, default=1e-4,
                   help="Adagrad's starting sum of squares (MLPs and "
                        "tables)")
    p.add_argument("--emb_bsp_reduce", default="sum",
                   choices=["sum", "mean"],
                   help="BSP: a table row takes the sum of the workers' "
                        "gradients (TorchRec's convention) or their mean "
                        "(DDP's); the MLPs take the mean")
    p.add_argument("--prefetch", type=int, default=1,
                   help="1: pull the next batch's rows during this step")
    p.add_argument("--eval_every", type=int, default=100000,
                   help="examples between rank 0's snapshots")
    p.add_argument("--eval_rows", type=int, default=50000)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per worker")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--progress", type=int, default=1,
                   help="1: print the live progress line")
    p.add_argument("--bin_dir", default="bazel-bin",
                   help="holds scheduler/ps_scheduler and server/ps_server")
    p.add_argument("--out_dir", default="out/dlrm")
    p.add_argument("--timeout_s", type=float, default=1800)
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
          f"servers, {args.steps} steps of {args.batch} per worker, tables "
          f"at {args.scale:g} of Criteo's sizes")
    r = run_job(args)
    planted = clicklog.Generator(seed=args.seed,
                                 scale=args.scale).planted(args.eval_rows)
    for p in r["curve"]:
        print(f"  {p['seconds']:7.1f} s  {p['examples']:9,d} examples  "
              f"AUC {p['auc']:.4f}  log loss {p['log_loss']:.4f}")
    final = r["curve"][-1]
    print(f"{args.mode}: AUC {final['auc']:.4f}, log loss "
          f"{final['log_loss']:.4f} after {r['examples']:,} examples "
          f"(best achievable on these rows: AUC {planted['auc']:.4f}, log "
          f"loss {planted['log_loss']:.4f}); {r['examples_per_s']:,.0f} "
          f"examples/s; worker peak RSS "
          f"{max(r['worker_peak_rss_mb']):.0f} MB, server "
          f"{max(r['server_peak_rss_mb'] or [0]):.0f} MB")
    png = write_curves(args.out_dir, {args.mode: r["curve"]}, planted)
    print(f"curve: {os.path.join(args.out_dir, 'curve.csv')}"
          + (f", plot: {png}" if png else " (gnuplot failed: no plot)"))
    with open(os.path.join(args.out_dir, "result.json"), "w") as f:
        json.dump(r, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
