#!/usr/bin/python3
"""Every kustomization under deploy/k8s renders and is a valid, complete
Downpour deployment.

For each overlay (dev, prod, gpu, pytorch), the L-BFGS job and the
namespace:
  - `kubectl kustomize` renders it without errors or warnings;
  - every object validates offline against the Kubernetes API schemas,
    strictly (validate.js: kubernetes-models and, for the monitoring
    component's PodMonitor and PrometheusRule, its prometheus-operator
    models; unknown fields rejected);
  - the rules hold (check_rules, check_cluster below): probes (startup,
    readiness, liveness), requests and limits, security context and Pod
    Security Admission's `restricted` profile, labels, Services that select
    pods, the job size taken from the ConfigMap, flags the binaries really
    have, every daemon serving Prometheus metrics on a port the
    NetworkPolicy opens to the monitoring namespace only, every namespaced
    object in the pods' namespace and every Secret and ConfigMap a pod
    uses there (as Kubernetes looks them up), no Namespace in an overlay,
    volumes retained, disruption budgets that Kubernetes supports and that
    let a node drain, ttlSecondsAfterFinished on Jobs;
  - the version is the repository's VERSION everywhere (labels, image
    tags);
  - an upgrade (every image tag and version label changed) changes no
    immutable field but a Job's template, which the documented upgrade
    deletes and applies again (README.md, "Upgrades");
  - the alerts (components/monitoring) pass `promtool check rules` and
    their unit tests (alerts_test.yaml), and the Grafana dashboard uses
    $__rate_interval and lower-case label values.
Then the checks are turned on broken copies, to show that each can fail.

Run by `bazel test //deploy:manifests_test`. Where the machine's kubectl is
too old for these manifests (Debian 12's own kubernetes-client is 1.20), it
says so and passes without checking: see deploy/k8s/README.md.
"""

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import k8s_pods  # noqa: E402

KUBECTL = "/usr/bin/kubectl"
NODE = "/usr/bin/node"
OVERLAYS = ["dev", "prod", "gpu", "pytorch"]
PROMTOOL = "/usr/bin/promtool"
NAMESPACE = "downpour"
PYTHON = "/usr/bin/python3"
# The volume types Pod Security Admission's `restricted` profile allows.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir",
                      "ephemeral", "persistentVolumeClaim", "projected",
                      "secret"}
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


def is_python_worker(container):
    """A user's training script (components/pytorch-workers): a batch
    process with no probes and no metrics port of its own."""
    return container.get("command", [None])[0] == PYTHON


def restricted_problems(spec, where):
    """What in pod spec `spec` Pod Security Admission's `restricted` profile
    (the namespace's enforce label) would refuse."""
    out = []
    psc = spec.get("securityContext", {})
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(host):
            out.append(f"{where}: {host} (restricted)")
    for v in spec.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"{where}: volume {v['name']} of type "
                       f"{sorted(kinds)} (restricted)")
    pod_seccomp = psc.get("seccompProfile", {}).get("type")
    for c in spec.get("initContainers", []) + spec.get("containers", []):
        cw = f"{where} container {c['name']}"
        sc = c.get("securityContext", {})
        if sc.get("privileged"):
            out.append(f"{cw}: privileged (restricted)")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{cw}: allowPrivilegeEscalation not false "
                       "(restricted)")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            out.append(f"{cw}: does not drop ALL capabilities (restricted)")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{cw}: adds capabilities {caps['add']} (restricted)")
        non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        if non_root is not True:
            out.append(f"{cw}: runAsNonRoot not true (restricted)")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.append(f"{cw}: runAsUser 0 (restricted)")
        seccomp = sc.get("seccompProfile", {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{cw}: seccomp profile {seccomp} (restricted)")
        for p in c.get("ports", []):
            if p.get("hostPort"):
                out.append(f"{cw}: hostPort {p['hostPort']} (restricted)")
    return out


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
            for m in c.get("volumeMounts", []):
                mounted.add(m["name"])
            if is_python_worker(c):
                # A training script: the Job restarts it; its figures come
                # from the scheduler (components/pytorch-workers).
                for field in ("readinessProbe", "livenessProbe",
                              "startupProbe", "ports"):
                    if field in c:
                        bad(f"{cw}: a Python worker declares {field}, "
                            "which nothing in it serves")
                continue
            ports = {p["containerPort"] for p in c.get("ports", [])}
            for probe, service in (("startupProbe", "liveness"),
                                   ("readinessProbe", ""),
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
        problems.extend(f"{name}: {p}"
                        for p in restricted_problems(spec, where))
        if w["kind"] == "Job" and "ttlSecondsAfterFinished" not in w["spec"]:
            bad(f"{where}: no ttlSecondsAfterFinished (finished Jobs pile up)")
        if w["kind"] == "StatefulSet" and w["spec"].get(
                "persistentVolumeClaimRetentionPolicy", {}).get(
                "whenDeleted") != "Retain":
            bad(f"{where}: does not say its volumes outlive it "
                "(persistentVolumeClaimRetentionPolicy.whenDeleted: Retain)")
        for claim in w["spec"].get("volumeClaimTemplates", []):
            if "app.kubernetes.io/version" in claim["metadata"].get(
                    "labels", {}):
                bad(f"{where}: claim {claim['metadata']['name']} carries the "
                    "version label (volumeClaimTemplates are immutable: an "
                    "upgrade could not be applied)")
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
        # Every Secret and ConfigMap a pod mounts, in the pod's namespace
        # (where the kubelet looks, and nowhere else).
        for v in pod.spec.get("volumes", []):
            for kind, key, ref in (("Secret", "secret", "secretName"),
                                   ("ConfigMap", "configMap", "name")):
                if key not in v:
                    continue
                wanted = v[key][ref]
                if k8s_pods.find(objects, kind, wanted,
                                 pod.namespace) is None:
                    elsewhere = k8s_pods.find(objects, kind, wanted)
                    bad(f"{pod.name} (namespace {pod.namespace}) mounts "
                        f"{kind} {wanted}, which is not in its namespace" +
                        (f" but in {k8s_pods.namespace_of(elsewhere)}"
                         if elsewhere else ""))
    # Every namespaced object in the pods' namespace.
    for o in objects:
        ns = k8s_pods.namespace_of(o)
        if o["kind"] == "Namespace":
            bad("renders the Namespace (deleting the deployment would delete "
                "its volumes): deploy/k8s/namespace makes it")
        elif ns != NAMESPACE:
            bad(f"{o['kind']}/{o['metadata']['name']} in namespace {ns}, "
                f"not the pods' {NAMESPACE}")
    problems.extend(f"{name}: {p}" for p in budget_problems(objects))
    return problems


def budget_problems(objects):
    """PodDisruptionBudgets: each selects pods of its namespace, uses a form
    Kubernetes supports for them (Job pods: an integer minAvailable only),
    and lets a node drain (at least one disruption while all are
    healthy)."""
    out = []
    replicas = {}
    pods = k8s_pods.pods_of(objects)
    for pdb in (o for o in objects if o["kind"] == "PodDisruptionBudget"):
        where = f"PodDisruptionBudget/{pdb['metadata']['name']}"
        spec = pdb["spec"]
        sel = spec.get("selector", {}).get("matchLabels", {})
        chosen = [p for p in pods if p.namespace == k8s_pods.namespace_of(pdb)
                  and k8s_pods._matches(sel, p.labels)]
        if not chosen:
            out.append(f"{where}: selects no pod")
            continue
        kinds = {p.kind for p in chosen}
        n = len(chosen)
        replicas[where] = n
        if "Job" in kinds:
            if "maxUnavailable" in spec or not isinstance(
                    spec.get("minAvailable"), int):
                out.append(f"{where}: selects Job pods, for which Kubernetes "
                           "supports only an integer minAvailable")
        if "maxUnavailable" in spec:
            m = spec["maxUnavailable"]
            allowed = m if isinstance(m, int) else int(
                str(m).rstrip("%")) * n // 100
        else:
            m = spec.get("minAvailable", 0)
            floor = m if isinstance(m, int) else -(-int(
                str(m).rstrip("%")) * n // 100)
            allowed = n - floor
        if allowed < 1:
            out.append(f"{where}: allows no disruption of its {n} pod(s): a "
                       "node drain would wait for ever")
    return out


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
    rank_env = {e["name"]: e.get("value") for e in wc.get("env", [])}
    if "--rank=$(JOB_COMPLETION_INDEX)" not in wc.get("args", []) and \
            rank_env.get("DOWNPOUR_RANK") != "$(JOB_COMPLETION_INDEX)":
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
    if not k8s_pods.find(objects, "Secret", "downpour-cluster-secret",
                         NAMESPACE):
        bad(f"no Secret downpour-cluster-secret in namespace {NAMESPACE}")
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
        for c in ("server", "scheduler", "worker"):
            if c not in budgets:
                problems.append(f"prod: no PodDisruptionBudget for {c}s")
        for o in objects:
            if o["kind"] == "PodDisruptionBudget" and o["spec"]["selector"][
                    "matchLabels"].get("app.kubernetes.io/component") == \
                    "worker" and o["spec"].get("minAvailable") != \
                    int(config["NUM_WORKERS"]) - 1:
                problems.append(
                    f"prod: the workers' budget minAvailable "
                    f"{o['spec'].get('minAvailable')} is not NUM_WORKERS - 1 "
                    f"= {int(config['NUM_WORKERS']) - 1}")
        kinds = {o["kind"] for o in objects}
        if not {"PodMonitor", "PrometheusRule"} <= kinds:
            problems.append("prod: no monitoring component (PodMonitor, "
                            "PrometheusRule)")
        anti = servers["spec"]["template"]["spec"].get("affinity", {}).get(
            "podAntiAffinity", {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution", [])
        if not any(t.get("topologyKey") == "kubernetes.io/hostname"
                   for t in anti):
            problems.append("prod: servers may share a node")
    if name == "pytorch":
        if not is_python_worker(wc):
            problems.append("pytorch: the workers do not run python3")
        script = [v for v in workers["spec"]["template"]["spec"]["volumes"]
                  if v.get("configMap", {}).get("name", "").startswith(
                      "downpour-train-script")]
        if not script:
            problems.append("pytorch: no training script mounted")
    if name == "gpu":
        if wc["resources"].get("limits", {}).get("nvidia.com/gpu") is None:
            problems.append("gpu: workers request no nvidia.com/gpu")
        if "--device=cuda" not in wc.get("args", []):
            problems.append("gpu: workers do not run --device=cuda")
    else:
        if "--device=cuda" in wc.get("args", []):
            problems.append(f"{name}: --device=cuda outside the gpu overlay")
    return problems


def version_problems(objects, name, version):
    """The version label on every workload and its pods, and every image
    tag, say the repository's VERSION (a tag may add a suffix: 0.1.0-cuda)."""
    out = []
    for w in workloads(objects):
        got = w["metadata"].get("labels", {}).get("app.kubernetes.io/version")
        if got != version:
            out.append(f"{name}: {w['kind']}/{w['metadata']['name']} has "
                       f"version label {got!r}, VERSION says {version}")
        tmpl = w["spec"]["template"]
        got = tmpl["metadata"].get("labels", {}).get(
            "app.kubernetes.io/version")
        if got != version:
            out.append(f"{name}: {w['kind']}/{w['metadata']['name']} pods "
                       f"have version label {got!r}, VERSION says {version}")
        for c in tmpl["spec"]["containers"]:
            tag = c["image"].rpartition(":")[2] if ":" in c["image"] else ""
            if tag != version and not tag.startswith(version + "-"):
                out.append(f"{name}: {w['metadata']['name']} runs "
                           f"{c['image']}, not a tag of VERSION {version}")
    return out


# Fields the API server refuses to change on an existing object: a change
# there makes `kubectl apply` fail.
IMMUTABLE = {
    "StatefulSet": [("spec", "selector"), ("spec", "serviceName"),
                    ("spec", "volumeClaimTemplates"),
                    ("spec", "podManagementPolicy")],
    "Job": [("spec", "selector"), ("spec", "template"),
            ("spec", "completionMode")],
    "Service": [("spec", "clusterIP")],
    "PersistentVolumeClaim": [("spec",)],
}
# What the documented upgrade (README.md, "Upgrades") deletes and applies
# again instead of patching.
RECREATED_ON_UPGRADE = {"Job"}


def upgrade_problems(before, after, name):
    """The objects of `after` (the same kustomization at a new version)
    that `kubectl apply` could not patch over `before`, beyond those the
    upgrade path recreates."""
    out = []
    for o in after:
        old = k8s_pods.find(before, o["kind"], o["metadata"]["name"],
                            k8s_pods.namespace_of(o))
        if old is None or o["kind"] not in IMMUTABLE:
            continue
        for path in IMMUTABLE[o["kind"]]:
            a, b = old, o
            for key in path:
                a, b = (a or {}).get(key), (b or {}).get(key)
            if a != b and o["kind"] not in RECREATED_ON_UPGRADE:
                out.append(f"{name}: an upgrade changes the immutable "
                           f"{'.'.join(path)} of {o['kind']}/"
                           f"{o['metadata']['name']}: kubectl apply would "
                           "fail")
    return out


def bump_version(k8s, version, new):
    """Sets every version label and image tag under `k8s` to `new`, as
    `kustomize edit set image` and an edit of the base's label would."""
    for dirpath, _, files in os.walk(k8s):
        for f in files:
            if f != "kustomization.yaml":
                continue
            path = os.path.join(dirpath, f)
            with open(path) as fh:
                text = fh.read()
            text = text.replace(f'"{version}', f'"{new}')
            with open(path, "w") as fh:
                fh.write(text)


def namespace_problems(objects):
    ns = [o for o in objects if o["kind"] == "Namespace"]
    if len(ns) != 1 or ns[0]["metadata"]["name"] != NAMESPACE:
        return [f"namespace: renders {len(ns)} Namespaces, want {NAMESPACE}"]
    labels = ns[0]["metadata"].get("labels", {})
    if labels.get("pod-security.kubernetes.io/enforce") != "restricted":
        return ["namespace: not labelled for Pod Security Admission "
                "(pod-security.kubernetes.io/enforce: restricted)"]
    return []


def alert_problems(objects, name, tmp):
    """promtool check rules and the unit tests of alerts_test.yaml, on the
    PrometheusRule's groups; None when promtool is not installed."""
    rules = [o for o in objects if o["kind"] == "PrometheusRule"]
    if not os.path.exists(PROMTOOL):
        return None
    out = []
    for r in rules:
        d = tempfile.mkdtemp(dir=tmp)
        with open(os.path.join(d, "rules.yaml"), "w") as f:
            yaml.safe_dump(r["spec"], f)
        shutil.copy(runfile("deploy/k8s/tests/alerts_test.yaml"), d)
        for cmd in (["check", "rules", "rules.yaml"],
                    ["test", "rules", "alerts_test.yaml"]):
            proc = subprocess.run([PROMTOOL] + cmd, cwd=d, capture_output=True,
                                  text=True, check=False)
            if proc.returncode != 0:
                out.append(f"{name}: promtool {' '.join(cmd)} failed:\n"
                           f"{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    return out


def dashboard_problems(dashboard):
    """Rates over $__rate_interval (Grafana's window that follows the
    scrape interval), and lower-case label values."""
    out = []
    text = json.dumps(dashboard)
    for m in re.finditer(r"\b(rate|irate)\(([^\[]*)\[([^\]]+)\]", text):
        if m.group(3) != "$__rate_interval":
            out.append(f"dashboard: {m.group(0)}...: use [$__rate_interval]")
    for m in re.finditer(r'\b([a-z_]+)!?=~?\\"([^\\"]*)\\"', text):
        if m.group(2) != m.group(2).lower() and not m.group(2).startswith("$"):
            out.append(f"dashboard: label value {m.group(1)}=\"{m.group(2)}\" "
                       "is not lower case")
    return out


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
    with open(runfile("VERSION")) as f:
        version = f.read().strip()
    kustomizations = [f"overlays/{o}" for o in OVERLAYS] + ["jobs/lbfgs"]
    for name in kustomizations + ["namespace"]:
        try:
            objects = k8s_pods.render(KUBECTL, os.path.join(k8s, name))
        except k8s_pods.PlanError as e:
            failures.append(str(e))
            continue
        rendered[name] = objects
        schema = validate_schemas(objects, node_modules)
        failures += [f"{name}: {p}" for p in schema]
        print(f"{name}: {len(objects)} objects, {len(schema)} schema problems")
    if "namespace" in rendered:
        failures += namespace_problems(rendered.pop("namespace"))

    dev_ports = policy_ports(rendered["overlays/dev"])
    dev_secret = k8s_pods.find(rendered["overlays/dev"], "Secret",
                               "downpour-cluster-secret")
    for name, objects in rendered.items():
        failures += version_problems(objects, name, version)
        if name.startswith("overlays/"):
            failures += check_rules(objects, name, policy_ports(objects))
            failures += check_cluster(objects, name)
            failures += check_overlay_specifics(name.split("/")[1], objects)
        else:
            # A job for a running cluster: its pods use the overlay's
            # Secret, applied first into the same namespace.
            failures += check_rules(objects + [dev_secret], name, dev_ports)
        alerts = alert_problems(objects, name, tmp)
        if alerts is None:
            print(f"{name}: {PROMTOOL} not installed: alerts not tested "
                  "(bash tools/setup.sh installs prometheus)")
        else:
            failures += alerts

    # An upgrade: every version label and image tag moves on; kubectl apply
    # must be able to patch everything but the Jobs.
    upgraded = os.path.join(tmp, "k8s-upgraded")
    shutil.copytree(k8s, upgraded)
    bump_version(upgraded, version, version + "9")
    for name in kustomizations:
        after = k8s_pods.render(KUBECTL, os.path.join(upgraded, name))
        failures += upgrade_problems(rendered[name], after, name)
        if after == rendered[name]:
            failures.append(f"{name}: the upgraded copy renders the same")

    with open(runfile("deploy/grafana/downpour.json")) as f:
        failures += dashboard_problems(json.load(f))

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
        ("the Secret in another namespace (issue 24)",
         lambda o: k8s_pods.find(o, "Secret", "downpour-cluster-secret")[
             "metadata"].pop("namespace"),
         "mounts Secret downpour-cluster-secret, which is not in its "
         "namespace but in default"),
        ("an object without a namespace",
         lambda o: policy(o)["metadata"].pop("namespace"),
         "NetworkPolicy/downpour-members-only in namespace default"),
        ("the Namespace in an overlay",
         lambda o: o.append({"apiVersion": "v1", "kind": "Namespace",
                             "metadata": {"name": "downpour"}}),
         "renders the Namespace"),
        ("no startup probe",
         lambda o: wc(o).pop("startupProbe"), "no gRPC startupProbe"),
        ("no ttlSecondsAfterFinished",
         lambda o: worker(o)["spec"].pop("ttlSecondsAfterFinished"),
         "no ttlSecondsAfterFinished"),
        ("a hostPath volume",
         lambda o: worker(o)["spec"]["template"]["spec"]["volumes"].append(
             {"name": "host", "hostPath": {"path": "/"}}),
         "of type ['hostPath'] (restricted)"),
        ("a pod that may run as root",
         lambda o: server(o)["spec"]["template"]["spec"][
             "securityContext"].pop("runAsNonRoot"),
         "runAsNonRoot not true (restricted)"),
        ("volumes deleted with the StatefulSet",
         lambda o: server(o)["spec"].pop(
             "persistentVolumeClaimRetentionPolicy"),
         "volumes outlive it"),
        ("the version in a claim template",
         lambda o: server(o)["spec"]["volumeClaimTemplates"][0]["metadata"][
             "labels"].update({"app.kubernetes.io/version": "0.1.0"}),
         "carries the version label"),
        ("maxUnavailable on Job pods",
         lambda o: o.append({"apiVersion": "policy/v1",
                             "kind": "PodDisruptionBudget",
                             "metadata": {"name": "w", "namespace": NAMESPACE},
                             "spec": {"maxUnavailable": 1, "selector": {
                                 "matchLabels": {
                                     "app.kubernetes.io/component":
                                         "worker"}}}}),
         "only an integer minAvailable"),
        ("a budget that blocks drains",
         lambda o: o.append({"apiVersion": "policy/v1",
                             "kind": "PodDisruptionBudget",
                             "metadata": {"name": "s", "namespace": NAMESPACE},
                             "spec": {"maxUnavailable": 0, "selector": {
                                 "matchLabels": {
                                     "app.kubernetes.io/component":
                                         "scheduler"}}}}),
         "allows no disruption"),
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

    # The other checks' self-tests: the version, an upgrade, the dashboard,
    # the alerts.
    more = 0
    bad_version = broken(lambda o: server(o)["metadata"]["labels"].update(
        {"app.kubernetes.io/version": "0.0.9"}))
    more += 1
    if not any("version label '0.0.9'" in f
               for f in version_problems(bad_version, "dev", version)):
        failures.append("self-test 'a stale version label' found nothing")
    frozen = broken(lambda o: server(o)["spec"]["volumeClaimTemplates"][0][
        "metadata"]["labels"].update({"app.kubernetes.io/version": "x"}))
    more += 1
    if not any("immutable spec.volumeClaimTemplates" in f
               for f in upgrade_problems(dev, frozen, "dev")):
        failures.append("self-test 'an immutable field changed' found nothing")
    more += 1
    found = dashboard_problems({"expr": 'rate(x{op="PUSH"}[1m])'})
    if not (any("use [$__rate_interval]" in f for f in found) and
            any('op="PUSH" is not lower case' in f for f in found)):
        failures.append(f"self-test of the dashboard checks: {found}")
    if os.path.exists(PROMTOOL):
        more += 1
        prod = copy.deepcopy(rendered["overlays/prod"])
        rule = [o for o in prod if o["kind"] == "PrometheusRule"][0]
        for r in rule["spec"]["groups"][0]["rules"]:
            r["expr"] = r["expr"].replace("> 0.9", "> 0.99")
        if not alert_problems(prod, "prod", tmp):
            failures.append("self-test 'an alert threshold moved': the "
                            "alerts' unit tests still pass")

    for f in failures:
        print("FAIL:", f)
    checked = len(rendered)
    print(f"{checked} kustomizations rendered and checked, "
          f"{len(cases) + len(schema_cases) + more} self-tests, "
          f"{len(failures)} problems")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
