#!/usr/bin/python3
"""The dev overlay starts a working cluster: its pods, run as local
processes with their exact commands, arguments and environment, train a
model to the end.

For each case below the kustomization is rendered with `kubectl kustomize`;
every pod the workloads would make becomes a process of the Bazel-built
binary its container names (k8s_pods.LocalPlan: downward-API fields
substituted, Service DNS names and the pod IP mapped to 127.0.0.1, every
container port its own local port, volumes as folders, the Secret's file
written where it is mounted). All start at once, in a shuffled order (the
seed is printed), as a cluster would start them. The test then:
  - probes every process as its gRPC readiness and liveness probes would,
    and requires each to be seen ready and alive;
  - scrapes every process's metrics port (the one Prometheus' annotation
    names) and requires Prometheus text from each, and once the jobs are
    done the job's figures from the scheduler and the servers;
  - waits for every Job pod to exit 0 (the training workers, the L-BFGS
    coordinator and its workers);
  - sends SIGTERM to the rest (scheduler, servers) and requires exit 0 within
    the pod's terminationGracePeriodSeconds;
  - checks that each worker took the rank of its completion index and that
    rank 0 evaluated the model at the last step;
  - at the end, that every metric deploy/grafana/downpour.json queries was
    served by some process.

Cases: the dev overlay as it is (1 scheduler, 1 server, 1 worker); dev with
NUM_SERVERS=2 and NUM_WORKERS=2 (the job size from the ConfigMap reaches the
StatefulSet, the Job and the scheduler); the L-BFGS job (jobs/lbfgs) on that
cluster; the same BSP job while `kubectl scale statefulset downpour-server`
goes 2 -> 3 -> 2 (the new pod takes key ranges, the removed one drains them
away and exits 0) ending with the unscaled run's parameters bit for bit
(psctl export of every mlp/ table); an SSP job (ELASTIC_WORKERS=1) whose
worker Job grows from 2 to 3 pods mid-run, the third taking the seat, every
epoch whose shares completed holding each example once; an upgrade as deploy/k8s/README.md documents it (dev with two
workers: once the job is under way, the worker Job is deleted, its pods
get SIGTERM and exit 143 after their step, and the Job of the overlay
rendered at the next version starts new pods, which take the ranks back,
resume at their clocks and finish the job); the pytorch overlay (two PyTorch workers running its train.py
with Debian's python3 and the downpour package, joining through the
environment contract the component sets). At the end, every metric the
dashboard and the alerts (components/monitoring) query must have been
served.
"""

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import k8s_pods  # noqa: E402

KUBECTL = "/usr/bin/kubectl"
PYTHON = "/usr/bin/python3"
BINARIES = {
    PYTHON: None,  # itself
    "/usr/local/bin/ps_scheduler": "scheduler/ps_scheduler",
    "/usr/local/bin/ps_server": "server/ps_server",
    "/usr/local/bin/ps_worker": "worker/ps_worker",
    "/usr/local/bin/ps_lbfgs": "lbfgs/ps_lbfgs",
}
JOB_TIMEOUT_S = 300


def runfile(rel):
    return os.path.join(os.environ["TEST_SRCDIR"],
                        os.environ.get("TEST_WORKSPACE", "downpour"), rel)


class Failure(Exception):
    pass


def tail(path, n=40):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return "(no log)"


def scrape(port, timeout=2.0):
    """The metrics text served on 127.0.0.1:`port`, or None."""
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                    timeout=timeout) as r:
            return r.read().decode()
    except OSError:
        return None


def metric(text, name, labels=""):
    """The value of sample `name{labels}` in `text` (labels as written,
    e.g. 'role="server",state="alive"'), or None."""
    want = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return None


# Every metric name scraped from any process of any case, for the Grafana
# dashboard's check at the end.
SCRAPED = set()


def note_names(text):
    for line in text.splitlines():
        m = re.match(r"([a-z_:][a-z0-9_:]*)[{ ]", line)
        if m:
            SCRAPED.add(m.group(1))


def metrics_port(plan, p):
    """The local port behind the pod's container port named metrics."""
    for c in p.pod.spec["containers"]:
        for port in c.get("ports", []):
            if port.get("name") == "metrics":
                return plan.ports[(p.pod.name, port["containerPort"])]
    return None


UPGRADED_JOB = "downpour-worker-next"
SERVERS = "downpour-server"


def scaled(objects, kind, name, replicas):
    """`objects` with workload `kind`/`name` at `replicas` (as `kubectl
    scale` leaves it)."""
    out = []
    for o in objects:
        if o["kind"] == kind and o["metadata"]["name"] == name:
            o = json.loads(json.dumps(o))
            o["spec"]["replicas"] = replicas
        out.append(o)
    return out


def export_params(scheduler_port, secret, out_dir, label):
    """Every mlp/ table of the running cluster to .npy files under
    `out_dir` with psctl export; returns {table: bytes of its .npy}."""
    psctl = runfile("psctl/psctl")
    common = [f"--scheduler=127.0.0.1:{scheduler_port}",
              f"--cluster_secret_file={secret}"]
    listed = subprocess.run([psctl, "tables", "-o", "json",
                             "--interval_ms=0"] + common,
                            capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        raise Failure(f"[{label}] psctl tables: {listed.stderr}")
    tables = [t["spec"]["name"] for t in json.loads(listed.stdout)["tables"]
              if t["spec"]["name"].startswith("mlp/")]
    if not tables:
        raise Failure(f"[{label}] no mlp/ table to export")
    os.makedirs(out_dir, exist_ok=True)
    params = {}
    for t in sorted(tables):
        prefix = os.path.join(out_dir, t.replace("/", "_"))
        r = subprocess.run([psctl, "export", f"--table={t}",
                            f"--out={prefix}"] + common,
                           capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise Failure(f"[{label}] psctl export {t}: {r.stderr}")
        with open(prefix + ".npy", "rb") as f:
            params[t] = f.read()
    return params


def run_cluster(objects, root, label, rng, extra_objects=(), upgrade=None,
                scale=None, export=None, grow_workers=None,
                shrink_workers=None):
    """Runs the pods of `objects` (then those of each of `extra_objects`,
    once the first are ready) to the end of their Jobs; returns
    {pod name: log path}. Raises Failure.

    upgrade: (clock, objects of the same overlay at the next version):
    once the scheduler's gating clock reaches `clock`, the worker Job is
    deleted (its pods get SIGTERM and must exit 143, or 0 if done) and the
    new version's worker Job starts (its pods named UPGRADED_JOB-<i>-local),
    as `kubectl delete job` and `kubectl apply -k` would.

    scale: (up clock, down clock): `kubectl scale statefulset
    downpour-server` one up once the gating clock reaches `up clock` (the
    new pod starts and must take key ranges while the job trains), and
    back down once it has and the clock reaches `down clock` (the pod gets
    SIGTERM, drains its ranges away and must exit 0). Both while the
    workers run.

    export: a folder: before the daemons are stopped, every mlp/ table is
    exported there (psctl export); the returned dict then has them under
    "params".

    grow_workers: a clock: the worker Job's completions and parallelism one
    more (as `kubectl patch job` of an Indexed Job makes them) once the
    gating clock reaches it; the new pod, of the next completion index,
    must take the next elastic seat and complete with the others.

    shrink_workers: a clock, after grow_workers: once the gating clock
    reaches it, `psctl retire` of the grown pod's rank, and the Job's
    completions and parallelism back down (`kubectl patch job`): the pod
    must finish its step, leave the job for good and exit 0, and the
    others complete without it."""
    binaries = {k: runfile(v) if v else k for k, v in BINARIES.items()}
    extra_server = None
    if scale is not None:
        sts = k8s_pods.find(objects, "StatefulSet", SERVERS)
        n = sts["spec"]["replicas"]
        extra_server = f"{SERVERS}-{n}"
        objects_planned = scaled(objects, "StatefulSet", SERVERS, n + 1)
    else:
        objects_planned = objects
    extra_worker = None
    if grow_workers is not None:
        job = k8s_pods.find(objects_planned, "Job", "downpour-worker")
        n = job["spec"]["completions"]
        extra_worker = f"downpour-worker-{n}-local"
        grown = []
        for o in objects_planned:
            if o is job:
                o = json.loads(json.dumps(o))
                o["spec"]["completions"] = o["spec"]["parallelism"] = n + 1
            grown.append(o)
        objects_planned = grown
    all_objects = list(objects_planned)
    for extra in extra_objects:
        all_objects += extra
    if upgrade is not None:
        job = k8s_pods.find(upgrade[1], "Job", "downpour-worker")
        job = dict(job, metadata=dict(job["metadata"], name=UPGRADED_JOB))
        all_objects.append(job)
    plan = k8s_pods.LocalPlan(all_objects, binaries, root)
    procs = plan.processes()
    first = {p.name for p in k8s_pods.pods_of(objects)}
    later = [p for p in procs if p.pod.name not in first and
             p.pod.workload["metadata"]["name"] != UPGRADED_JOB and
             p.pod.name not in (extra_server, extra_worker)]
    waves = [[p for p in procs if p.pod.name in first], later,
             [p for p in procs
              if p.pod.workload["metadata"]["name"] == UPGRADED_JOB]]
    running = {}   # name -> (LocalProcess, Popen, log path)
    seen = {}      # name -> {"ready": bool, "alive": bool}
    exits = {}     # name -> exit status
    logs = {}

    def start(wave):
        rng.shuffle(wave)
        for p in wave:
            log = os.path.join(root, p.pod.name + ".log")
            logs[p.pod.name] = log
            # The image's environment: the downpour package on the path
            # (deploy/Containerfile, target python).
            env = {"PATH": "/usr/local/bin:/usr/bin:/bin",
                   "HOSTNAME": p.pod.name,
                   "PYTHONPATH": runfile("python")}
            env.update(p.env)
            print(f"[{label}] start {p.name}: {' '.join(p.argv)}")
            with open(log, "wb") as out:
                popen = subprocess.Popen(p.argv, env=env, stdout=out,
                                         stderr=subprocess.STDOUT,
                                         cwd=root)
            running[p.pod.name] = (p, popen, log)
            seen[p.pod.name] = {"ready": False, "alive": False,
                                "metrics": False}

    def poll_once():
        for name, (p, popen, log) in list(running.items()):
            rc = popen.poll()
            if rc is not None:
                exits[name] = rc
                del running[name]
                kind = p.pod.kind
                if kind != "Job":
                    raise Failure(f"[{label}] {name} ({kind}) exited {rc} "
                                  f"while the job ran:\n{tail(log)}")
                if rc != 0:
                    raise Failure(f"[{label}] {name} exited {rc}:\n{tail(log)}")
                print(f"[{label}] {name} exited 0")
                continue
            s = seen[name]
            if not s["ready"] and "readiness" in p.probes:
                port, service = p.probes["readiness"]
                if k8s_pods.health_status(port, service, 0.5) == \
                        k8s_pods.SERVING:
                    s["ready"] = True
                    print(f"[{label}] {name} ready")
            if s["ready"] and metrics_port(plan, p) is not None and \
                    time.time() - s.get("scraped", 0) > 1.0:
                s["scraped"] = time.time()
                text = scrape(metrics_port(plan, p), 0.5)
                if text is not None:
                    note_names(text)
                if not s["metrics"] and text is not None and \
                        metric(text, "process_cpu_seconds_total") is not None:
                    s["metrics"] = True
                    print(f"[{label}] {name} serves metrics")
            if not s["alive"] and "liveness" in p.probes:
                port, service = p.probes["liveness"]
                if k8s_pods.health_status(port, service, 0.5) == \
                        k8s_pods.SERVING:
                    s["alive"] = True

    try:
        deadline = time.time() + JOB_TIMEOUT_S
        start(waves[0])
        if waves[1]:
            # A job applied to a running cluster: once its pods are ready.
            while not all(seen[p.pod.name]["ready"] for p in waves[0]
                          if p.pod.kind != "Job"):
                poll_once()
                if time.time() > deadline:
                    raise Failure(f"[{label}] cluster not ready in time")
                time.sleep(0.05)
            start(waves[1])
        upgraded = upgrade is None
        scheduler = next(p for p in procs if p.pod.labels.get(
            "app.kubernetes.io/component") == "scheduler")
        # Scaling: 0 not yet, 1 the new server started, 2 it holds ranges,
        # 3 scaled back down (it drained and exited 0).
        scale_state = 0 if scale is not None else 3
        grown = grow_workers is None
        retire = None  # psctl retire of the grown pod's rank, once started
        retire_log = os.path.join(root, "psctl-retire.log")
        while any(p.pod.kind == "Job" for p, _, _ in running.values()):
            if scale_state < 3:
                scale_state = scale_step(scale, scale_state, plan, procs,
                                         scheduler, running, exits, label,
                                         extra_server, start)
            if not grown:
                text = scrape(metrics_port(plan, scheduler), 0.5) or ""
                gating = metric(text, "downpour_job_gating_clock")
                if gating is not None and gating >= grow_workers:
                    grown = True
                    print(f"[{label}] gating clock {gating:.0f}: the worker "
                          f"Job grows by one ({extra_worker})")
                    start([p for p in procs if p.pod.name == extra_worker])
            elif shrink_workers is not None and retire is None:
                text = scrape(metrics_port(plan, scheduler), 0.5) or ""
                gating = metric(text, "downpour_job_gating_clock")
                if gating is not None and gating >= shrink_workers:
                    rank = extra_worker.split("-")[-2]
                    print(f"[{label}] gating clock {gating:.0f}: psctl "
                          f"retire {rank}, then the worker Job shrinks by "
                          f"one ({extra_worker} leaves)")
                    with open(retire_log, "wb") as out:
                        retire = subprocess.Popen(
                            [runfile("psctl/psctl"), "retire", rank,
                             "--scheduler=127.0.0.1:"
                             f"{plan.ports[(scheduler.pod.name, 7070)]}",
                             "--cluster_secret_file="
                             f"{secret_file(plan, scheduler)}",
                             "--timeout_s=120"],
                            stdout=out, stderr=subprocess.STDOUT)
            poll_once()
            if not upgraded:
                text = scrape(metrics_port(plan, scheduler), 0.5) or ""
                gating = metric(text, "downpour_job_gating_clock")
                if gating is not None and gating >= upgrade[0]:
                    upgraded = True
                    delete_worker_job(running, exits, label, gating)
                    start(waves[2])
            if time.time() > deadline:
                raise Failure(f"[{label}] jobs still running after "
                              f"{JOB_TIMEOUT_S} s: {sorted(running)}")
            time.sleep(0.05)
        if scale_state < 3:
            raise Failure(f"[{label}] the job ended before the servers were "
                          f"scaled up and down (step {scale_state})")
        if not grown:
            raise Failure(f"[{label}] the job ended before its worker Job "
                          f"grew")
        if shrink_workers is not None:
            if retire is None:
                raise Failure(f"[{label}] the job ended before its worker "
                              f"Job shrank")
            rc = retire.wait(timeout=130)
            if rc != 0:
                raise Failure(f"[{label}] psctl retire exited {rc}:\n"
                              f"{tail(retire_log)}")
            print(f"[{label}] {tail(retire_log, 1).strip()}")
            with open(logs[extra_worker], errors="replace") as f:
                if "asked to leave the job for good" not in f.read():
                    raise Failure(f"[{label}] {extra_worker} did not leave "
                                  f"when retired:\n"
                                  f"{tail(logs[extra_worker])}")
        if export is not None:
            logs["params"] = export_params(
                plan.ports[(scheduler.pod.name, 7070)],
                secret_file(plan, scheduler), export, label)
        # The daemons' figures once the jobs are done.
        for name, (p, popen, log) in running.items():
            text = scrape(metrics_port(plan, p))
            if text is None:
                raise Failure(f"[{label}] {name}: no metrics")
            note_names(text)
            seen[name]["metrics"] = True
            component = p.pod.labels.get("app.kubernetes.io/component")
            if component == "server":
                if metric(text, "downpour_server_ready") != 1:
                    raise Failure(f"[{label}] {name} not ready in its metrics")
                if not any(line.startswith("downpour_server_requests_total")
                           and float(line.split()[-1]) > 0
                           for line in text.splitlines()):
                    raise Failure(f"[{label}] {name} counted no request")
            if component == "scheduler":
                alive = metric(text, "downpour_cluster_nodes",
                               'role="server",state="alive"')
                if not alive:
                    raise Failure(f"[{label}] {name}: no live server in its "
                                  f"metrics:\n{text[:2000]}")
            print(f"[{label}] {name}: metrics checked")
        for name, s in seen.items():
            p = next(x for x in procs if x.pod.name == name)
            declared = {"ready": "readiness" in p.probes,
                        "alive": "liveness" in p.probes,
                        "metrics": metrics_port(plan, p) is not None}
            for what in ("ready", "alive", "metrics"):
                if declared[what] and not s[what]:
                    raise Failure(f"[{label}] {name} was never seen {what} "
                                  f"by its probe:\n{tail(logs[name])}")
        # Graceful termination of the daemons, as at `kubectl delete`.
        for name, (p, popen, log) in list(running.items()):
            popen.send_signal(signal.SIGTERM)
        for name, (p, popen, log) in list(running.items()):
            try:
                rc = popen.wait(timeout=p.grace_s)
            except subprocess.TimeoutExpired:
                raise Failure(f"[{label}] {name} still running "
                              f"{p.grace_s} s after SIGTERM "
                              f"(terminationGracePeriodSeconds):\n{tail(log)}")
            exits[name] = rc
            del running[name]
            if rc != 0:
                raise Failure(f"[{label}] {name} exited {rc} on SIGTERM:\n"
                              f"{tail(log)}")
            print(f"[{label}] {name} stopped on SIGTERM, exit 0")
    finally:
        for name, (p, popen, log) in running.items():
            popen.kill()
            popen.wait()
    return logs


def secret_file(plan, p):
    """Where the cluster secret is mounted for process `p`."""
    for arg in p.argv:
        if arg.startswith("--cluster_secret_file="):
            return arg.split("=", 1)[1]
    raise Failure(f"{p.name} has no --cluster_secret_file")


SCALE_LOG = {}


def scale_step(scale, state, plan, procs, scheduler, running, exits, label,
               extra_server, start):
    """One poll of `kubectl scale` up then down (run_cluster's `scale`);
    returns the new state."""
    text = scrape(metrics_port(plan, scheduler), 0.5) or ""
    gating = metric(text, "downpour_job_gating_clock")
    if gating is None:
        return state
    if state == 0 and gating >= scale[0]:
        print(f"[{label}] gating clock {gating:.0f}: kubectl scale "
              f"statefulset {SERVERS} up ({extra_server})")
        start([p for p in procs if p.pod.name == extra_server])
        SCALE_LOG[label] = {"up": gating}
        return 1
    if state == 1:
        p = running[extra_server][0]
        served = scrape(metrics_port(plan, p), 0.5) or ""
        moves = metric(text, "downpour_cluster_range_moves")
        if "downpour_range_bytes{" in served and moves == 0:
            print(f"[{label}] gating clock {gating:.0f}: {extra_server} "
                  f"serves key ranges, no move under way")
            SCALE_LOG[label]["took_ranges"] = gating
            return 2
        return 1
    if state == 2 and gating >= scale[1]:
        print(f"[{label}] gating clock {gating:.0f}: kubectl scale "
              f"statefulset {SERVERS} down ({extra_server} gets SIGTERM)")
        p, popen, log = running.pop(extra_server)
        popen.send_signal(signal.SIGTERM)
        try:
            rc = popen.wait(timeout=p.grace_s)
        except subprocess.TimeoutExpired:
            raise Failure(f"[{label}] {extra_server} still running "
                          f"{p.grace_s} s after SIGTERM:\n{tail(log)}")
        exits[extra_server] = rc
        with open(log, errors="replace") as f:
            drained = "left the cluster" in f.read()
        if rc != 0 or not drained:
            raise Failure(f"[{label}] {extra_server} exited {rc} on SIGTERM "
                          f"(drained: {drained}):\n{tail(log)}")
        print(f"[{label}] {extra_server} drained its ranges away and "
              f"exited 0")
        SCALE_LOG[label]["down"] = gating
        return 3
    return state


def delete_worker_job(running, exits, label, gating):
    """`kubectl delete job downpour-worker`: SIGTERM to its pods; each must
    finish its step, leave the job and exit 143 (0 if it had finished)
    within its grace period."""
    pods = [n for n, (p, _, _) in running.items()
            if p.pod.workload["metadata"]["name"] == "downpour-worker"]
    print(f"[{label}] gating clock {gating:.0f}: deleting the worker Job "
          f"({', '.join(pods)})")
    for n in pods:
        running[n][1].send_signal(signal.SIGTERM)
    for n in pods:
        p, popen, log = running.pop(n)
        try:
            rc = popen.wait(timeout=p.grace_s)
        except subprocess.TimeoutExpired:
            raise Failure(f"[{label}] {n} still running {p.grace_s} s after "
                          f"SIGTERM:\n{tail(log)}")
        exits[n] = rc
        if rc not in (0, 143):
            raise Failure(f"[{label}] {n} exited {rc} on SIGTERM, not 143:\n"
                          f"{tail(log)}")
        print(f"[{label}] {n} left the job, exit {rc}")


def check_upgrade(objects, logs, label):
    """The new version's workers took the ranks back and resumed at their
    clocks (not at 0), and rank 0 finished the job."""
    config = next(o["data"] for o in objects if o["kind"] == "ConfigMap"
                  and o["metadata"]["name"].startswith("downpour-job"))
    workers = int(config["NUM_WORKERS"])
    for i in range(workers):
        name = f"{UPGRADED_JOB}-{i}-local"
        with open(logs[name], errors="replace") as f:
            text = f.read()
        m = re.search(rf"rank {i} of {workers}\b.*resuming at clock (\d+)",
                      text)
        if not m or int(m.group(1)) == 0:
            raise Failure(f"[{label}] {name} did not resume rank {i} at its "
                          f"clock:\n{tail(logs[name])}")
        print(f"[{label}] {name}: rank {i} resumed at clock {m.group(1)}")


def check_training(objects, logs, label, job="downpour-worker"):
    config = next(o["data"] for o in objects if o["kind"] == "ConfigMap"
                  and o["metadata"]["name"].startswith("downpour-job"))
    workers = int(config["NUM_WORKERS"])
    steps = int(config["STEPS"])
    for i in range(workers):
        name = f"{job}-{i}-local"
        with open(logs[name], errors="replace") as f:
            text = f.read()
        if not re.search(rf"rank {i} of {workers}\b", text):
            raise Failure(f"[{label}] {name} did not take rank {i} of "
                          f"{workers}:\n{tail(logs[name])}")
        if i == 0:
            m = re.search(rf"clock {steps}: train loss \S+, test accuracy "
                          r"([0-9.]+)", text)
            if not m:
                raise Failure(f"[{label}] rank 0 did not evaluate at clock "
                              f"{steps}:\n{tail(logs[name])}")
            accuracy = float(m.group(1))
            print(f"[{label}] rank 0: test accuracy {accuracy} after "
                  f"{steps} steps")
            # A 784-256-10 MLP passes 70% on Fashion-MNIST within a few
            # hundred steps; a broken exchange stays near 10%.
            if accuracy < 0.70:
                raise Failure(f"[{label}] test accuracy {accuracy} < 0.70")


def check_epochs(logs, label, names, joiner, examples=60000):
    """The workers `names` (pod names; `joiner` the one that took a seat)
    drew each epoch's examples from the scheduler's splits: every epoch
    whose shares all completed holds `examples` (each once), the joiner
    trained only in splits that counted it, and in at least one."""
    line = re.compile(r"epoch (\d+): trained (\d+) examples, share (\d+) "
                      r"of (\d+)")
    shares, counts = {}, {}
    for name in names:
        with open(logs[name], errors="replace") as f:
            text = f.read()
        mine = line.findall(text)
        if name == joiner:
            if "not in its split" not in text:
                raise Failure(f"[{label}] {name} joined during no epoch:\n"
                              f"{tail(logs[name])}")
            if not mine:
                raise Failure(f"[{label}] {name} completed no share:\n"
                              f"{tail(logs[name])}")
        for epoch, n, index, count in mine:
            epoch, index, count = int(epoch), int(index), int(count)
            if index in shares.setdefault(epoch, {}):
                raise Failure(f"[{label}] share {index} of epoch {epoch} "
                              f"completed twice")
            shares[epoch][index] = int(n)
            if counts.setdefault(epoch, count) != count:
                raise Failure(f"[{label}] epoch {epoch} split two ways")
    complete = [e for e in shares if len(shares[e]) == counts[e]]
    for e in complete:
        if sum(shares[e].values()) != examples:
            raise Failure(f"[{label}] epoch {e}: {sum(shares[e].values())} "
                          f"examples trained, not {examples}")
    grown = [e for e in complete if counts[e] == len(names)]
    if not grown:
        raise Failure(f"[{label}] no complete epoch of all {len(names)} "
                      f"workers: {shares}")
    print(f"[{label}] epochs {sorted(complete)} complete, each of "
          f"{examples} examples once; split over {len(names)} workers from "
          f"epoch {min(grown)}")


def check_dashboard():
    """Every metric the Grafana dashboard and the alerts query was served by
    some process above (a renamed metric would leave a panel empty, or an
    alert silent)."""
    import json
    with open(runfile("deploy/grafana/downpour.json")) as f:
        dashboard = json.dumps(json.load(f))
    with open(runfile("deploy/k8s/components/monitoring/"
                      "prometheus-rule.yaml")) as f:
        alerts = f.read()
    for what, text in (("dashboard", dashboard), ("alerts", alerts)):
        wanted = set(re.findall(r"\b((?:downpour|process)_[a-z0-9_]+)", text))
        missing = sorted(n for n in wanted if n not in SCRAPED)
        if missing:
            raise Failure(f"the {what} query metrics no process served: "
                          f"{missing}")
        print(f"{what}: all {len(wanted)} metrics queried were served")


def main():
    sys.stdout.reconfigure(line_buffering=True)  # progress in the test log
    problem = k8s_pods.kubectl_problem(KUBECTL)
    if problem:
        print(f"SKIPPED: {problem}")
        return 0
    seed = int(os.environ.get("LOCAL_CLUSTER_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (LOCAL_CLUSTER_SEED={seed} repeats the start order)")
    rng = random.Random(seed)
    tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    k8s = os.path.join(tmp, "k8s")
    k8s_pods.copy_tree(runfile("deploy/k8s"), k8s)
    subprocess.run([runfile("tools/ps_keygen"),
                    f"--out={k8s}/overlays/dev/cluster.secret"], check=True,
                   capture_output=True)
    # dev, two servers and two workers: only the ConfigMap changes.
    bigger = os.path.join(k8s, "overlays", "dev-2x2")
    os.makedirs(bigger)
    bigger_yaml = """apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../dev
components:
  - ../../components/job-size
configMapGenerator:
  - name: downpour-job
    behavior: merge
    literals:
      - NUM_SERVERS=2
      - NUM_WORKERS=2
      - STEPS=300
"""
    with open(os.path.join(bigger, "kustomization.yaml"), "w") as f:
        f.write(bigger_yaml)
    try:
        dev = k8s_pods.render(KUBECTL, os.path.join(k8s, "overlays/dev"))
        logs = run_cluster(dev, os.path.join(tmp, "dev"), "dev", rng)
        check_training(dev, logs, "dev")

        dev2 = k8s_pods.render(KUBECTL, bigger)
        lbfgs = k8s_pods.render(KUBECTL, os.path.join(k8s, "jobs/lbfgs"))
        # A shorter L-BFGS run than the manifest's 100 iterations would
        # change its arguments; 100 iterations of softmax take ~10 s here.
        logs = run_cluster(dev2, os.path.join(tmp, "dev-2x2"), "dev-2x2", rng,
                           extra_objects=[lbfgs],
                           export=os.path.join(tmp, "dev-2x2-params"))
        check_training(dev2, logs, "dev-2x2")
        reference = logs["params"]

        # The same job while `kubectl scale statefulset downpour-server`
        # goes 2 -> 3 -> 2: its BSP parameters end bit for bit as above.
        elastic = run_cluster(dev2, os.path.join(tmp, "elastic"), "elastic",
                              rng, scale=(60, 160),
                              export=os.path.join(tmp, "elastic-params"))
        check_training(dev2, elastic, "elastic")
        print(f"[elastic] scaled: {SCALE_LOG['elastic']}")
        if elastic["params"] != reference:
            differ = sorted(t for t in reference
                            if elastic["params"].get(t) != reference[t])
            raise Failure(f"[elastic] final parameters differ from the "
                          f"unscaled run's in {differ}")
        print(f"[elastic] final parameters of {len(reference)} tables equal "
              f"the unscaled run's, bit for bit")
        with open(logs["downpour-lbfgs-local-0"], errors="replace") as f:
            text = f.read()
        if "accuracy" not in text:
            raise Failure("the L-BFGS coordinator printed no summary:\n" +
                          tail(logs["downpour-lbfgs-local-0"]))

        # An SSP job on dev-2x2 whose worker Job grows from 2 to 3 pods
        # while it trains (the third takes the elastic seat), and back to 2
        # (psctl retire of its rank, then the Job patched down).
        ssp = os.path.join(k8s, "overlays", "dev-ssp")
        os.makedirs(ssp)
        with open(os.path.join(ssp, "kustomization.yaml"), "w") as f:
            f.write(bigger_yaml.replace(
                "      - STEPS=300\n",
                "      - STEPS=240\n      - MODEL=softmax\n"
                "      - BATCH=500\n      - CONSISTENCY=ssp\n"
                "      - STALENESS=2\n      - ELASTIC_WORKERS=1\n"))
        grow = k8s_pods.render(KUBECTL, ssp)
        logs = run_cluster(grow, os.path.join(tmp, "workers"), "workers", rng,
                           grow_workers=30, shrink_workers=150)
        check_training(grow, logs, "workers")
        joiner = "downpour-worker-2-local"
        with open(logs[joiner], errors="replace") as f:
            if not re.search(r"rank 2 of 2, consistency SSP", f.read()):
                raise Failure(f"[workers] {joiner} did not take the seat:\n"
                              f"{tail(logs[joiner])}")
        check_epochs(logs, "workers",
                     [f"downpour-worker-{i}-local" for i in range(3)], joiner)

        # An upgrade of dev with two workers: the same overlay at the next
        # version (every image tag and version label moved on).
        two = os.path.join(k8s, "overlays", "dev-2w")
        os.makedirs(two)
        with open(os.path.join(two, "kustomization.yaml"), "w") as f:
            f.write(bigger_yaml.replace("NUM_SERVERS=2", "NUM_SERVERS=1")
                    .replace("STEPS=300", "STEPS=400"))
        before = k8s_pods.render(KUBECTL, two)
        nxt = os.path.join(tmp, "k8s-next")
        shutil.copytree(k8s, nxt)
        for dirpath, _, files in os.walk(nxt):
            if "kustomization.yaml" in files:
                path = os.path.join(dirpath, "kustomization.yaml")
                with open(path) as f:
                    text = f.read()
                with open(path, "w") as f:
                    f.write(text.replace('"0.1.0', '"0.1.0-next'))
        after = k8s_pods.render(KUBECTL, os.path.join(nxt, "overlays/dev-2w"))
        if after == before:
            raise Failure("the next version renders the same objects")
        logs = run_cluster(before, os.path.join(tmp, "upgrade"), "upgrade",
                           rng, upgrade=(100, after))
        check_upgrade(before, logs, "upgrade")
        check_training(before, logs, "upgrade", job=UPGRADED_JOB)

        subprocess.run([runfile("tools/ps_keygen"),
                        f"--out={k8s}/overlays/pytorch/cluster.secret"],
                       check=True, capture_output=True)
        pytorch = k8s_pods.render(KUBECTL, os.path.join(k8s,
                                                        "overlays/pytorch"))
        logs = run_cluster(pytorch, os.path.join(tmp, "pytorch"), "pytorch",
                           rng)
        check_training(pytorch, logs, "pytorch")
        check_dashboard()
    except (Failure, k8s_pods.PlanError) as e:
        print(f"FAIL: {e}")
        return 1
    print("PASS: dev, dev-2x2, the L-BFGS job, servers scaled 2 -> 3 -> 2 "
          "mid-job, workers 2 -> 3 mid-job (SSP), an upgrade and the "
          "PyTorch workers ran to the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
