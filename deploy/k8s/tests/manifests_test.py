#!/usr/bin/python3
"""Every kustomization under deploy/k8s renders and is a valid, complete
Downpour deployment.

For each overlay (dev, prod, gpu) and the L-BFGS job:
  - `kubectl kustomize` renders it without errors or warnings;
  - every object validates offline against the Kubernetes API schemas,
    strictly (validate.js: kubernetes-models, unknown fields rejected);
  - the rules of issue 12 hold (check_rules below): probes, requests and
    limits, security context, labels, Services that select pods, the job
    size taken from the ConfigMap, flags the binaries really have, every
    daemon serving Prometheus metrics on a port the NetworkPolicy opens to
    the monitoring namespace only, ...
Then the checks are turned on broken copies, to show that each can fail.

Run by `bazel test //deploy:manifests_test`. Where the machine's kubectl is
too old for these manifests (Debian 12's own kubernetes-client is 1.20), it
says so and passes without checking: see deploy/k8s/README.md.
"""

import copy
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import k8s_pods  # noqa: E402

KUBECTL = "/usr/bin/kubectl"
NODE = "/usr/bin/node"
OVERLAYS = ["dev", "prod", "gpu"]
METRICS_PORT = 9090
LABELS = ["name", "instance", "component", "part-of", "managed-by", "version"]
BINARIES = {
    "/usr/local/bin/ps_scheduler": "scheduler/ps_scheduler",
    "/usr/local/bin/ps_server": "server/ps_server",
    "/usr/local/bin/ps_worker": "worker/ps_worker",
    "/usr/local/bin/ps_lbfgs": "lbfgs/ps_lbfgs",
}


def runfile(rel):
    return os.path.join(os.environ["TEST_SRCDIR"],
                        os.environ.get("TEST_WORKSPACE", "downpour"), rel)


def quantity(q):
    """A Kubernetes quantity as a float (cpu cores or bytes)."""
    m = re.fullmatch(r"([0-9.]+)(m|Ki|Mi|Gi|Ti|k|M|G|T)?", str(q))
    if not m:
        raise ValueError(f"quantity {q!r}")
    scale = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
             "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    return float(m.group(1)) * scale[m.group(2)]


_flag_cache = {}


def known_flags(binary):
    """The flags `binary --helpfull` lists."""
    if binary not in _flag_cache:
        out = subprocess.run([binary, "--helpfull"], capture_output=True,
                             text=True, check=False)
        _flag_cache[binary] = set(re.findall(r"^\s+--([a-z_0-9]+) ",
                                             out.stdout + out.stderr, re.M))
    return _flag_cache[binary]


def workloads(objects):
    return [o for o in objects if o["kind"] in ("StatefulSet", "Job",
                                                "Deployment")]


def job_config(objects):
    for o in objects:
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith(
                "downpour-job"):
            return o["data"]
    return None


def check_rules(objects, name, policy_ports=None):
    """The problems of the rendered `objects` of kustomization `name`."""
    problems = []

    def bad(what):
        problems.append(f"{name}: {what}")

    pods = k8s_pods.pods_of(objects)
    templates = {}  # workload name -> pod template
    for w in workloads(objects):
        wname = w["metadata"]["name"]
        tmpl = w["spec"]["template"]
        templates[wname] = tmpl
        spec = tmpl["spec"]
        where = f"{w['kind']}/{wname}"
        for label in LABELS:
            key = f"app.kubernetes.io/{label}"
            if key not in w["metadata"].get("labels", {}):
                bad(f"{where}: no label {key}")
            if key not in tmpl["metadata"].get("labels", {}):
                bad(f"{where}: pod template has no label {key}")
        psc = spec.get("securityContext", {})
        if psc.get("runAsNonRoot") is not True or psc.get("runAsUser", 0) == 0:
            bad(f"{where}: pods may run as root")
        if psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            bad(f"{where}: no RuntimeDefault seccomp profile")
        if spec.get("automountServiceAccountToken") is not False:
            bad(f"{where}: mounts a service account token it does not use")
        if "terminationGracePeriodSeconds" not in spec:
            bad(f"{where}: no terminationGracePeriodSeconds")
        mounted = set()
        for c in spec["containers"]:
            cw = f"{where} container {c['name']}"
            sc = c.get("securityContext", {})
            if sc.get("allowPrivilegeEscalation") is not False:
                bad(f"{cw}: allows privilege escalation")
            if sc.get("readOnlyRootFilesystem") is not True:
                bad(f"{cw}: root filesystem is writable")
            if "ALL" not in sc.get("capabilities", {}).get("drop", []):
                bad(f"{cw}: does not drop all capabilities")
            if sc.get("privileged"):
                bad(f"{cw}: privileged")
            res = c.get("resources", {})
            for kind in ("requests", "limits"):
                for r in ("cpu", "memory"):
                    if r not in res.get(kind, {}):
                        bad(f"{cw}: no {r} in {kind}")
            for r, v in res.get("requests", {}).items():
                lim = res.get("limits", {}).get(r)
                if lim is not None and quantity(lim) < quantity(v):
                    bad(f"{cw}: {r} limit {lim} below its request {v}")
            ports = {p["containerPort"] for p in c.get("ports", [])}
            for probe, service in (("readinessProbe", ""),
                                   ("livenessProbe", "liveness")):
                p = c.get(probe)
                if p is None or "grpc" not in p:
                    bad(f"{cw}: no gRPC {probe}")
                    continue
                if p["grpc"]["port"] not in ports:
                    bad(f"{cw}: {probe} on undeclared port {p['grpc']['port']}")
                if p["grpc"].get("service", "") != service:
                    bad(f"{cw}: {probe} asks service "
                        f"'{p['grpc'].get('service', '')}', not '{service}'")
            if not c.get("command") or not c["command"][0].startswith("/"):
                bad(f"{cw}: no absolute command")
            elif c["command"][0] not in BINARIES:
                bad(f"{cw}: runs {c['command'][0]}, not a Downpour binary")
            else:
                flags = known_flags(runfile(BINARIES[c["command"][0]]))
                for a in c["command"][1:] + c.get("args", []):
                    m = re.match(r"--([a-z_0-9]+)(=|$)", a)
                    if m and m.group(1) not in flags:
                        bad(f"{cw}: {os.path.basename(c['command'][0])} has "
                            f"no flag --{m.group(1)}")
            for m in c.get("volumeMounts", []):
                mounted.add(m["name"])
            # Every daemon serves Prometheus metrics on a declared port
            # named "metrics", the one its scrape annotation names.
            listen = [a for a in c.get("args", [])
                      if a.startswith("--metrics_listen=")]
            mports = [p["containerPort"] for p in c.get("ports", [])
                      if p.get("name") == "metrics"]
            annotations = tmpl["metadata"].get("annotations", {})
            if not listen or not mports:
                bad(f"{cw}: serves no metrics (--metrics_listen and a port "
                    "named metrics)")
            elif listen[0] != f"--metrics_listen=0.0.0.0:{mports[0]}":
                bad(f"{cw}: {listen[0]} is not its metrics port {mports[0]}")
            elif annotations.get("prometheus.io/scrape") != "true" or \
                    annotations.get("prometheus.io/port") != str(mports[0]):
                bad(f"{cw}: no prometheus.io scrape annotations for port "
                    f"{mports[0]}")
            if policy_ports is not None:
                for p in c.get("ports", []):
                    if p.get("name") != "health" and \
                            p["containerPort"] not in policy_ports:
                        bad(f"{cw}: port {p['containerPort']} is not in the "
                            "NetworkPolicy")
        for claim in w["spec"].get("volumeClaimTemplates", []):
            if claim["metadata"]["name"] not in mounted:
                bad(f"{where}: claim {claim['metadata']['name']} never mounted")
        if w["kind"] == "StatefulSet":
            svc = k8s_pods.find(objects, "Service", w["spec"].get("serviceName"))
            if svc is None or svc["spec"].get("clusterIP") != "None":
                bad(f"{where}: serviceName {w['spec'].get('serviceName')} is "
                    "not a headless Service here")
            if not w["spec"].get("volumeClaimTemplates"):
                bad(f"{where}: no PersistentVolumeClaim")

    for svc in (o for o in objects if o["kind"] == "Service"):
        sel = svc["spec"].get("selector", {})
        backing = [p for p in pods if k8s_pods._matches(sel, p.labels)]
        if not backing:
            bad(f"Service/{svc['metadata']['name']} selects no pod")
        for port in svc["spec"].get("ports", []):
            target = port.get("targetPort", port["port"])
            for p in backing:
                names = {x.get("name") for c in p.spec["containers"]
                         for x in c.get("ports", [])}
                nums = {x["containerPort"] for c in p.spec["containers"]
                        for x in c.get("ports", [])}
                if target not in names | nums:
                    bad(f"Service/{svc['metadata']['name']}: {p.name} has no "
                        f"port {target}")

    # Every environment resolves (ConfigMaps and Secrets exist) and nothing
    # is left unexpanded.
    for pod in pods:
        for c in pod.spec["containers"]:
            try:
                env = k8s_pods.container_env(pod, c, objects)
            except k8s_pods.PlanError as e:
                bad(str(e))
                continue
            for a in c.get("command", []) + c.get("args", []):
                left = re.findall(r"\$\(([A-Za-z_0-9]+)\)",
                                  k8s_pods.expand(a, env))
                if left:
                    bad(f"{pod.name}: {a} refers to undefined {left}")
        for v in pod.spec.get("volumes", []):
            if "secret" in v and k8s_pods.find(
                    objects, "Secret", v["secret"]["secretName"]) is None:
                if name != "jobs/lbfgs":  # the overlay's Secret, applied first
                    bad(f"{pod.name}: Secret {v['secret']['secretName']} "
                        "is not rendered")
    return problems


def check_cluster(objects, name):
    """The rules of a whole cluster (an overlay)."""
    problems = []

    def bad(what):
        problems.append(f"{name}: {what}")

    config = job_config(objects)
    if config is None:
        return [f"{name}: no downpour-job ConfigMap"]
    want_servers = int(config["NUM_SERVERS"])
    want_workers = int(config["NUM_WORKERS"])
    sched = k8s_pods.find(objects, "StatefulSet", "downpour-scheduler")
    servers = k8s_pods.find(objects, "StatefulSet", "downpour-server")
    workers = k8s_pods.find(objects, "Job", "downpour-worker")
    if sched is None or servers is None or workers is None:
        return [f"{name}: scheduler, servers or workers missing"]
    if sched["spec"]["replicas"] != 1:
        bad("the scheduler StatefulSet must have exactly 1 replica")
    if servers["spec"]["replicas"] != want_servers:
        bad(f"{servers['spec']['replicas']} servers, NUM_SERVERS is "
            f"{want_servers}")
    spec = workers["spec"]
    if spec.get("completionMode") != "Indexed":
        bad("the worker Job is not Indexed")
    if spec.get("completions") != want_workers or \
            spec.get("parallelism") != want_workers:
        bad(f"worker Job completions {spec.get('completions')} and "
            f"parallelism {spec.get('parallelism')}, NUM_WORKERS is "
            f"{want_workers}")
    wc = spec["template"]["spec"]["containers"][0]
    if "--rank=$(JOB_COMPLETION_INDEX)" not in wc.get("args", []):
        bad("workers do not take their rank from JOB_COMPLETION_INDEX")
    pods = {p.name: p for p in k8s_pods.pods_of(objects)}
    sp = pods["downpour-scheduler-0"]
    sc = sp.spec["containers"][0]
    env = k8s_pods.container_env(sp, sc, objects)
    args = [k8s_pods.expand(a, env) for a in sc["args"]]
    if f"--num_workers={want_workers}" not in args:
        bad(f"scheduler args {args} do not say --num_workers={want_workers}")
    if f"--min_servers={want_servers}" not in args:
        bad(f"scheduler args {args} do not say --min_servers={want_servers}")
    if not k8s_pods.find(objects, "Namespace", "downpour"):
        bad("no Namespace")
    if not k8s_pods.find(objects, "Secret", "downpour-cluster-secret"):
        bad("no Secret downpour-cluster-secret")
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    if len(policies) != 1:
        bad(f"{len(policies)} NetworkPolicies, want 1")
    else:
        pol = policies[0]["spec"]
        for p in pods.values():
            if not k8s_pods._matches(pol["podSelector"]["matchLabels"],
                                     p.labels):
                bad(f"the NetworkPolicy does not cover {p.name}")
        rules = pol.get("ingress", [])
        if pol.get("policyTypes") != ["Ingress"] or not 1 <= len(rules) <= 2:
            bad("the NetworkPolicy is not one Ingress rule for members "
                "(and one for Prometheus)")
        for peer in rules[0].get("from", [None]) if rules else []:
            if peer is None or set(peer) != {"podSelector"}:
                bad(f"the NetworkPolicy admits {peer}, not only members")
        # The second rule: Prometheus, from its namespace, to the metrics
        # port only.
        for rule in rules[1:]:
            ports = {p.get("port") for p in rule.get("ports", [])}
            if ports != {METRICS_PORT}:
                bad(f"the NetworkPolicy admits Prometheus to {sorted(ports)}, "
                    f"not only the metrics port {METRICS_PORT}")
            for peer in rule.get("from", [None]):
                if peer is None or set(peer) != {"namespaceSelector"}:
                    bad(f"the NetworkPolicy's metrics rule admits {peer}, not "
                        "a namespace")
    return problems


def policy_ports(objects):
    pol = [o for o in objects if o["kind"] == "NetworkPolicy"][0]["spec"]
    return {p["port"] for rule in pol["ingress"] for p in rule.get("ports", [])}


def check_overlay_specifics(name, objects):
    problems = []
    servers = k8s_pods.find(objects, "StatefulSet", "downpour-server")
    workers = k8s_pods.find(objects, "Job", "downpour-worker")
    wc = workers["spec"]["template"]["spec"]["containers"][0]
    config = job_config(objects)
    if name == "dev":
        if (config["NUM_SERVERS"], config["NUM_WORKERS"]) != ("1", "1"):
            problems.append("dev: not one server and one worker")
    if name == "prod":
        budgets = {o["spec"]["selector"]["matchLabels"].get(
            "app.kubernetes.io/component")
            for o in objects if o["kind"] == "PodDisruptionBudget"}
        for c in ("server", "scheduler"):
            if c not in budgets:
                problems.append(f"prod: no PodDisruptionBudget for {c}s")
        anti = servers["spec"]["template"]["spec"].get("affinity", {}).get(
            "podAntiAffinity", {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution", [])
        if not any(t.get("topologyKey") == "kubernetes.io/hostname"
                   for t in anti):
            problems.append("prod: servers may share a node")
    if name == "gpu":
        if wc["resources"].get("limits", {}).get("nvidia.com/gpu") is None:
            problems.append("gpu: workers request no nvidia.com/gpu")
        if "--device=cuda" not in wc.get("args", []):
            problems.append("gpu: workers do not run --device=cuda")
    else:
        if "--device=cuda" in wc.get("args", []):
            problems.append(f"{name}: --device=cuda outside the gpu overlay")
    return problems


def validate_schemas(objects, node_modules):
    proc = subprocess.run(
        [NODE, runfile("deploy/k8s/tests/validate.js")],
        input=json.dumps(objects), capture_output=True, text=True,
        env={"NODE_PATH": node_modules, "PATH": "/usr/bin:/bin"}, check=False)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"validate.js failed: {proc.stderr}")
    return proc.stdout.splitlines()


def main():
    sys.stdout.reconfigure(line_buffering=True)  # progress in the test log
    problem = k8s_pods.kubectl_problem(KUBECTL)
    if problem:
        print(f"SKIPPED: {problem}")
        return 0
    # node_modules lives beside the real package.json (tools/setup.sh runs
    # npm ci there); runfiles are links to the source tree.
    pkg_dir = os.path.dirname(os.path.realpath(
        runfile("deploy/k8s/tests/package.json")))
    node_modules = os.path.join(pkg_dir, "node_modules")
    if not os.path.isdir(os.path.join(node_modules, "kubernetes-models")):
        print(f"FAILED: {node_modules} has no kubernetes-models; run "
              "bash tools/setup.sh")
        return 1

    tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    k8s = os.path.join(tmp, "k8s")
    k8s_pods.copy_tree(runfile("deploy/k8s"), k8s)
    keygen = runfile("tools/ps_keygen")
    failures = []
    rendered = {}
    for overlay in OVERLAYS:
        subprocess.run([keygen, f"--out={k8s}/overlays/{overlay}/cluster.secret"],
                       check=True, capture_output=True)
    for name in [f"overlays/{o}" for o in OVERLAYS] + ["jobs/lbfgs"]:
        try:
            objects = k8s_pods.render(KUBECTL, os.path.join(k8s, name))
        except k8s_pods.PlanError as e:
            failures.append(str(e))
            continue
        rendered[name] = objects
        schema = validate_schemas(objects, node_modules)
        failures += [f"{name}: {p}" for p in schema]
        print(f"{name}: {len(objects)} objects, {len(schema)} schema problems")

    dev_ports = policy_ports(rendered["overlays/dev"])
    for name, objects in rendered.items():
        if name.startswith("overlays/"):
            failures += check_rules(objects, name, policy_ports(objects))
            failures += check_cluster(objects, name)
            failures += check_overlay_specifics(name.split("/")[1], objects)
        else:
            failures += check_rules(objects, name, dev_ports)

    # Each check must be able to fail: break copies of dev and look for the
    # complaint.
    dev = rendered["overlays/dev"]

    def broken(mutate):
        objs = copy.deepcopy(dev)
        mutate(objs)
        return objs

    def worker(objs):
        return k8s_pods.find(objs, "Job", "downpour-worker")

    def server(objs):
        return k8s_pods.find(objs, "StatefulSet", "downpour-server")

    def wc(objs):
        return worker(objs)["spec"]["template"]["spec"]["containers"][0]

    def policy(objs):
        return [o for o in objs if o["kind"] == "NetworkPolicy"][0]

    cases = [
        ("no readiness probe",
         lambda o: wc(o).pop("readinessProbe"), "no gRPC readinessProbe"),
        ("liveness on the readiness service",
         lambda o: wc(o)["livenessProbe"]["grpc"].pop("service"),
         "livenessProbe asks service ''"),
        ("no memory limit",
         lambda o: wc(o)["resources"]["limits"].pop("memory"),
         "no memory in limits"),
        ("writable root",
         lambda o: wc(o)["securityContext"].update(
             readOnlyRootFilesystem=False), "root filesystem is writable"),
        ("a flag the binary lacks",
         lambda o: wc(o)["args"].append("--replicas=2"), "no flag --replicas"),
        ("worker count out of step",
         lambda o: worker(o)["spec"].update(completions=3),
         "worker Job completions 3"),
        ("server count out of step",
         lambda o: server(o)["spec"].update(replicas=5), "5 servers"),
        ("no index rank",
         lambda o: wc(o)["args"].remove("--rank=$(JOB_COMPLETION_INDEX)"),
         "do not take their rank"),
        ("missing label",
         lambda o: server(o)["metadata"]["labels"].pop(
             "app.kubernetes.io/component"), "no label app.kubernetes.io/component"),
        ("a Service selecting nothing",
         lambda o: k8s_pods.find(o, "Service", "downpour-server")["spec"][
             "selector"].update({"app.kubernetes.io/component": "nope"}),
         "selects no pod"),
        ("an undefined variable",
         lambda o: wc(o)["args"].append("--steps=$(NO_SUCH)"),
         "undefined ['NO_SUCH']"),
        ("a port outside the NetworkPolicy",
         lambda o: wc(o)["ports"].append({"name": "x", "containerPort": 9999}),
         "port 9999 is not in the NetworkPolicy"),
        ("no metrics endpoint",
         lambda o: wc(o)["args"].remove("--metrics_listen=0.0.0.0:9090"),
         "serves no metrics"),
        ("metrics on an undeclared port",
         lambda o: wc(o)["args"].__setitem__(
             wc(o)["args"].index("--metrics_listen=0.0.0.0:9090"),
             "--metrics_listen=0.0.0.0:9091"),
         "is not its metrics port"),
        ("no scrape annotation",
         lambda o: worker(o)["spec"]["template"]["metadata"][
             "annotations"].pop("prometheus.io/port"),
         "no prometheus.io scrape annotations"),
        ("Prometheus admitted to a data port",
         lambda o: policy(o)["spec"]["ingress"][1]["ports"].append(
             {"protocol": "TCP", "port": 7100}),
         "admits Prometheus to [7100, 9090]"),
        ("the metrics rule admitting any pod",
         lambda o: policy(o)["spec"]["ingress"][1]["from"].append(
             {"ipBlock": {"cidr": "0.0.0.0/0"}}),
         "metrics rule admits"),
    ]
    for what, mutate, expect in cases:
        objs = broken(mutate)
        found = check_rules(objs, "dev", policy_ports(objs)) + \
            check_cluster(objs, "dev")
        if not any(expect in f for f in found):
            failures.append(f"self-test '{what}': no problem containing "
                            f"'{expect}' in {found}")
    schema_cases = [
        ("unknown field", lambda o: wc(o).update(readinesProbe={}),
         'unknown field "readinesProbe"'),
        ("bad quantity",
         lambda o: wc(o)["resources"]["limits"].update(cpu="2 cores"),
         "limits/cpu"),
        ("string port", lambda o: wc(o)["ports"][0].update(containerPort="80"),
         "containerPort must be integer"),
    ]
    for what, mutate, expect in schema_cases:
        found = validate_schemas(broken(mutate), node_modules)
        if not any(expect in f for f in found):
            failures.append(f"schema self-test '{what}': no problem "
                            f"containing '{expect}' in {found}")

    for f in failures:
        print("FAIL:", f)
    checked = len(rendered)
    print(f"{checked} kustomizations rendered and checked, "
          f"{len(cases) + len(schema_cases)} self-tests, "
          f"{len(failures)} problems")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
