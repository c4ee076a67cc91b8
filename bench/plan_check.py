#!/usr/bin/python3
"""Checks `psctl plan` against measured runs (issue 25).

Calibrates this machine (`psctl calibrate`, unless --calibration is given),
asks `psctl plan --json` for the predicted examples/s of every
configuration of the grid, runs each one with `ps_demo` (the MLP
784-256-10 on Fashion-MNIST, batches of 64, every process on this host as
`psctl plan --placement=shared` assumes) and prints predicted against
measured, the error of each, and whether the goals hold: every prediction
within 20% of its measurement, and the configuration the plan recommends
within 10% of the fastest measured.

    bazel build //psctl //tools:ps_demo
    /usr/bin/python3 bench/plan_check.py                  # 1,2,4 x 1,2, bsp+asp
    /usr/bin/python3 bench/plan_check.py --workers=1,2,4,8 --servers=1,2,4

--replay=RESULTS --cores_from=CAL,... runs nothing: it takes the predictions
and measurements of an earlier run (its results.json) and predicts each
configuration again with the cores that another calibration file measured
(the host term only; every other term as recorded), to show how much of
the error follows from that one probe. It also prints how far the rounds
of one configuration lie apart.

The measured figure is ps_demo's "examples/s (all training)": examples per
second while every worker trains (start-up, the last steps and the final
evaluation left out), the quantity the model predicts. Each run is sized
from its prediction to last about --run_seconds. On a host shared with
other users' work, --refresh_cores measures the cores it gives again before
each run and predicts that run from them. Exit status 0 when both
goals hold, 1 when one does not, 2 when a run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

MLP = {
    "name": "mlp",
    "batch": 64,
    "dense_layers": [784, 256, 10],
    # What ps_worker's tables use: momentum (rate 1) under BSP, Adagrad
    # under SSP and ASP (worker/internal/dense_replica.cc).
    "handler": {"bsp": "momentum", "ssp": "adagrad", "asp": "adagrad"},
}


def run(cmd: List[str], timeout: float) -> str:
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError("%s exited %d:\n%s" % (" ".join(cmd), p.returncode,
                                                   p.stdout[-3000:]))
    return p.stdout


def load_average() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def measure(args, workers: int, servers: int, mode: str, steps: int
            ) -> Tuple[float, float, float, float]:
    """Runs ps_demo once: examples/s while all train, training seconds, and
    the workers' and the servers' CPU ms per worker step meanwhile."""
    out_dir = os.path.join(args.out_dir, "runs", "%s-w%d-s%d" % (mode, workers,
                                                                  servers))
    os.makedirs(out_dir, exist_ok=True)
    cmd = [os.path.join(args.bin_dir, "tools", "ps_demo"),
           "--mode=" + mode, "--workers=%d" % workers,
           "--servers=%d" % servers, "--steps=%d" % steps,
           "--eval_every=%d" % steps, "--poll_ms=%d" % args.poll_ms,
           "--staleness=%d" % args.staleness, "--out_dir=" + out_dir,
           "--timeout_s=%d" % args.run_timeout_s]
    text = run(cmd, args.run_timeout_s + 60)
    rate = train_s = None
    cpu_w = cpu_s = float("nan")
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[0].startswith(mode):
            rate, train_s = float(cells[3]), float(cells[2])
        m = re.search(r"CPU per worker step .*: workers ([0-9.]+) ms, "
                      r"servers ([0-9.]+) ms", line)
        if m:
            cpu_w, cpu_s = float(m.group(1)), float(m.group(2))
    if rate is None:
        raise RuntimeError("no result row in ps_demo's output:\n" +
                           text[-2000:])
    return rate, train_s, cpu_w, cpu_s


def median(v: List[float]) -> float:
    v = sorted(v)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] +
                                               v[len(v) // 2]) / 2


def effective_cores(curve: List[Tuple[float, float]], threads: float) -> float:
    """ComputeCalibration::EffectiveCores (planner/calibration.cc)."""
    prev_t = prev_c = 0.0
    for t, c in curve:
        if threads <= t:
            return prev_c + (c - prev_c) * (threads - prev_t) / (t - prev_t)
        prev_t, prev_c = t, c
    return prev_c


def print_round_spread(runs: Dict[str, List[dict]]) -> None:
    """How far the rounds of one configuration lie apart: a model cannot be
    checked more closely than the measurement repeats."""
    spreads = []
    for key, rs in runs.items():
        m = [x["examples_per_s"] for x in rs]
        if len(m) > 1 and min(m) > 0:
            spreads.append(((max(m) - min(m)) / min(m), key))
    if spreads:
        spreads.sort()
        print("rounds of one configuration apart (max/min - 1): median "
              "%.0f%%, largest %.0f%% (%s), over 20%% in %d of %d" %
              (100 * median([x for x, _ in spreads]), 100 * spreads[-1][0],
               spreads[-1][1], sum(1 for x, _ in spreads if x > 0.2),
               len(spreads)))


def replay(args) -> int:
    with open(args.replay) as f:
        results = json.load(f)
    batch = results["plan"]["model"]["batch"]
    runs = results["runs"]
    print_round_spread(runs)
    for path in args.cores_from.split(","):
        with open(path) as f:
            cal = json.load(f)
        curve = [(e["threads"], e["cores"])
                 for e in cal["compute"]["effective_cores"]]
        host_cores = cal["cluster"]["cores"]
        errors = []
        for key, rs in runs.items():
            w, s = (int(x) for x in key.split(",")[:2])
            predicted = []
            for x in rs:
                # Predict's shared-host term (planner/perf_model.cc) with
                # these cores.
                t = x["predicted"]["terms"]
                cpu = t["host_ms"] * t["effective_cores"]
                busy = min(max(cpu / t["critical_ms"], 1.0), 2 * (w + s))
                cores = min(busy, host_cores, effective_cores(curve, busy))
                step = max(t["critical_ms"], t["server_ms"], t["nic_ms"],
                           cpu / cores)
                predicted.append(w * batch / step * 1e3)
            measured = median([x["examples_per_s"] for x in rs])
            errors.append(median(predicted) / measured - 1)
        worst = max(errors, key=abs)
        print("%s: cores %s: within %.0f%%: %d of %d, worst %+.0f%%" %
              (path, ", ".join("%g: %.2f" % c for c in curve),
               100 * args.tolerance,
               sum(1 for e in errors if abs(e) <= args.tolerance),
               len(errors), 100 * worst))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--servers", default="1,2")
    p.add_argument("--modes", default="bsp,asp")
    p.add_argument("--staleness", type=int, default=3, help="SSP's bound")
    p.add_argument("--bin_dir", default=os.path.join(ROOT, "bazel-bin"))
    p.add_argument("--out_dir", default=os.path.join(ROOT, "out", "plan_check"))
    p.add_argument("--calibration", default="",
                   help="an existing calibration file (default: calibrate "
                   "now, into out_dir/calibration.json)")
    p.add_argument("--probe_seconds", type=float, default=0.25)
    p.add_argument("--run_seconds", type=float, default=4.0,
                   help="each run's steps are sized from its prediction to "
                   "train for about this long")
    p.add_argument("--min_steps", type=int, default=300)
    p.add_argument("--max_steps", type=int, default=4000)
    p.add_argument("--rounds", type=int, default=1,
                   help="runs per configuration (the median counts); rounds "
                   "go through the whole grid in turn")
    p.add_argument("--poll_ms", type=int, default=50)
    p.add_argument("--refresh_cores", action="store_true",
                   help="before each run, measure again the cores this host "
                   "gives (psctl calibrate --cores_only) and predict that "
                   "run from it: for a host shared with other users' work, "
                   "whose load moves by the minute")
    p.add_argument("--run_timeout_s", type=int, default=300)
    p.add_argument("--tolerance", type=float, default=0.20)
    p.add_argument("--recommend_tolerance", type=float, default=0.10)
    p.add_argument("--replay", default="",
                   help="an earlier run's results.json: predict it again "
                   "with the cores of each --cores_from file; runs nothing")
    p.add_argument("--cores_from", default="",
                   help="comma-separated calibration files, for --replay")
    args = p.parse_args()
    if args.replay:
        if not args.cores_from:
            print("--replay needs --cores_from", file=sys.stderr)
            return 2
        return replay(args)
    os.makedirs(args.out_dir, exist_ok=True)
    psctl = os.path.join(args.bin_dir, "psctl", "psctl")
    for b in (psctl, os.path.join(args.bin_dir, "tools", "ps_demo")):
        if not os.access(b, os.X_OK):
            print("missing %s: bazel build //psctl //tools:ps_demo" % b,
                  file=sys.stderr)
            return 2
    model = os.path.join(args.out_dir, "mlp.json")
    with open(model, "w") as f:
        json.dump(MLP, f, indent=2)

    started = time.time()
    cal = args.calibration
    if not cal:
        cal = os.path.join(args.out_dir, "calibration.json")
        print("calibrating (load average %.1f) ..." % load_average(),
              flush=True)
        text = run([psctl, "calibrate", "--model=" + model,
                    "--calibration=" + cal,
                    "--probe_seconds=%g" % args.probe_seconds], 600)
        print(text, flush=True)
    plan_cmd = [psctl, "plan", "--model=" + model, "--calibration=" + cal,
                "--workers=" + args.workers, "--servers=" + args.servers,
                "--modes=" + args.modes, "--staleness=%d" % args.staleness,
                "--json"]
    plan = json.loads(run(plan_cmd, 120))
    predicted: Dict[Tuple[int, int, str], dict] = {}
    for row in plan["configurations"]:
        predicted[(row["workers"], row["servers"], row["mode"])] = row
    rec = plan["recommended"]
    rec_key = (rec["workers"], rec["servers"], rec["mode"])

    # Per configuration, one entry per run: the prediction it is compared
    # with (the first plan's, or one from the cores measured just before
    # it) and what the run measured.
    runs: Dict[Tuple[int, int, str], List[dict]] = {k: [] for k in predicted}
    fresh_cal = os.path.join(args.out_dir, "calibration.fresh.json")
    if args.refresh_cores:
        with open(cal) as src, open(fresh_cal, "w") as dst:
            dst.write(src.read())
    batch = plan["model"]["batch"]
    keys = sorted(predicted, key=lambda k: (k[0], k[1], k[2]))
    for r in range(args.rounds):
        for key in keys:
            w, s, mode = key
            pred = predicted[key]
            steps = int(args.run_seconds * pred["examples_per_s"] /
                        (w * batch))
            steps = max(args.min_steps, min(args.max_steps, steps))
            load = load_average()
            if args.refresh_cores:
                run([psctl, "calibrate", "--cores_only",
                     "--calibration=" + fresh_cal,
                     "--probe_seconds=%g" % args.probe_seconds], 120)
                one = json.loads(run(
                    [psctl, "plan", "--model=" + model,
                     "--calibration=" + fresh_cal, "--workers=%d" % w,
                     "--servers=%d" % s, "--modes=" + mode,
                     "--staleness=%d" % args.staleness, "--json"], 60))
                pred = one["configurations"][0]
            try:
                rate, train_s, cpu_w, cpu_s = measure(args, w, s, mode, steps)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                print("run %s failed: %s" % (key, e), file=sys.stderr)
                return 2
            runs[key].append({"predicted": pred, "examples_per_s": rate,
                              "training_s": train_s, "steps": steps,
                              "worker_cpu_ms": cpu_w, "server_cpu_ms": cpu_s,
                              "load": load})
            p_rate = pred["examples_per_s"]
            err = (p_rate - rate) / rate if rate > 0 else 0
            print("round %d: %d workers, %d servers, %s, %d steps: measured "
                  "%.0f examples/s (training %.2f s, load %.1f), predicted "
                  "%.0f (%+.0f%%)" % (r, w, s, mode, steps, rate, train_s,
                                      load, p_rate, 100 * err), flush=True)

    def med(key, f) -> float:
        return median([f(x) for x in runs[key]])

    def job_cores(x) -> float:
        return ((x["worker_cpu_ms"] + x["server_cpu_ms"]) *
                x["examples_per_s"] / batch / 1e3)

    def posterior(x, w: int) -> float:
        t = x["predicted"]["terms"]
        cpu_ms = t["host_ms"] * max(t["effective_cores"], 1e-9)
        step_ms = max(t["critical_ms"], t["server_ms"], t["nic_ms"],
                      cpu_ms / max(job_cores(x), 1e-9))
        return w * batch / step_ms * 1e3

    rows = []
    worst = 0.0
    for key in keys:
        w = key[0]
        m = med(key, lambda x: x["examples_per_s"])
        pr = med(key, lambda x: x["predicted"]["examples_per_s"])
        err = (pr - m) / m
        worst = max(worst, abs(err))
        t = lambda x: x["predicted"]["terms"]  # noqa: E731
        rows.append({
            "key": key, "predicted": pr, "measured": m, "error": err,
            "bottleneck": runs[key][-1]["predicted"]["bottleneck"],
            # CPU per worker step: the model's against the processes'.
            "worker_cpu": (med(key, lambda x: t(x)["compute_ms"] +
                               t(x)["client_cpu_ms"]),
                           med(key, lambda x: x["worker_cpu_ms"])),
            "server_cpu": (med(key, lambda x: t(x)["servers_cpu_ms"] / w),
                           med(key, lambda x: x["server_cpu_ms"])),
            # Cores: what the model assumed, and what the job kept busy.
            "cores": (med(key, lambda x: t(x)["effective_cores"]),
                      med(key, lambda x: job_cores(x))),
            # The model's error had it known the cores the job got: the
            # host term recomputed with them (the model's CPU, not the
            # measured one), the other terms as predicted.
            "posterior_error": med(key, lambda x: posterior(x, w)) / m - 1,
        })
    fastest_key = max(keys, key=lambda k: med(k, lambda x:
                                              x["examples_per_s"]))
    fastest = med(fastest_key, lambda x: x["examples_per_s"])
    if args.refresh_cores:
        # The recommendation from the refreshed predictions (the plan's rule:
        # within 3% of the fastest, the fewest processes, BSP < SSP < ASP).
        pr = {r["key"]: r["predicted"] for r in rows}
        best = max(pr.values())
        order = {"bsp": 0, "ssp": 1, "asp": 2}
        rec_key = min((k for k in keys if pr[k] >= 0.97 * best),
                      key=lambda k: (k[0] + k[1], order[k[2]]))
    rec_measured = med(rec_key, lambda x: x["examples_per_s"])

    print("\n| workers | servers | mode | predicted ex/s | measured ex/s | "
          "error | predicted bottleneck | worker CPU ms/step, predicted / "
          "measured | servers' CPU ms/step, predicted / measured | cores, "
          "assumed / the job's | error with the job's cores |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        w, s, mode = r["key"]
        mark = " (recommended)" if r["key"] == rec_key else ""
        print("| %d | %d | %s%s | %.0f | %.0f | %+.0f%% | %s | %.2f / %.2f | "
              "%.2f / %.2f | %.2f / %.2f | %+.0f%% |" %
              (w, s, mode, mark, r["predicted"], r["measured"],
               100 * r["error"], r["bottleneck"], r["worker_cpu"][0],
               r["worker_cpu"][1], r["server_cpu"][0], r["server_cpu"][1],
               r["cores"][0], r["cores"][1], 100 * r["posterior_error"]))
    within = sum(1 for r in rows if abs(r["error"]) <= args.tolerance)
    goal1 = within == len(rows)
    goal2 = rec_measured >= (1 - args.recommend_tolerance) * fastest
    print("\npredictions within %.0f%%: %d of %d (worst %.0f%%) -> %s" %
          (100 * args.tolerance, within, len(rows), 100 * worst,
           "met" if goal1 else "NOT met"))
    print("recommended %d workers, %d servers, %s: measured %.0f examples/s; "
          "fastest measured %d workers, %d servers, %s: %.0f (%.0f%% of it) "
          "-> %s" % (rec_key + (rec_measured,) + fastest_key +
                     (fastest, 100 * rec_measured / fastest,
                      "met" if goal2 else "NOT met")))
    print_round_spread({"%d,%d,%s" % k: v for k, v in runs.items()})
    print("took %.0f s; load average now %.1f" % (time.time() - started,
                                                  load_average()))
    with open(os.path.join(args.out_dir, "results.json"), "w") as f:
        json.dump({"calibration": cal, "plan": plan,
                   "runs": {"%d,%d,%s" % k: v for k, v in runs.items()},
                   "goal_within": goal1, "goal_recommended": goal2}, f,
                  indent=2)
    return 0 if goal1 and goal2 else 1


if __name__ == "__main__":
    sys.exit(main())
