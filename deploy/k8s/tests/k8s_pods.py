"""Rendering Downpour's kustomizations and turning their pods into processes.

What Kubernetes would do with a rendered overlay, as far as a test on one
machine can follow it: the pods each workload makes (StatefulSet ordinals,
Indexed Job completion indexes), each container's exact command, arguments
and environment (ConfigMap and Secret references, downward-API fields, the
Job controller's JOB_COMPLETION_INDEX, `$(VAR)` expansion as the kubelet
does it), its volumes, and its probes. `LocalPlan` then maps that onto
loopback: Service DNS names and pod IPs become 127.0.0.1, every declared
container port gets its own free local port, mount paths become folders.

Used by manifests_test.py and local_cluster_test.py; run with Debian's
/usr/bin/python3 (python3-yaml, python3-grpcio).
"""

import base64
import json
import os
import re
import shutil
import socket
import subprocess

import yaml

# The oldest kustomize these manifests are written for: `labels`,
# `replacements` and components with generator options (kubectl >= 1.27).
MIN_KUSTOMIZE = (5, 0, 0)

INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"

# Kinds that live outside namespaces; every other kind is namespaced, and an
# object rendered without a namespace lands in the current one when applied
# ("default" here).
CLUSTER_SCOPED = {
    "Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume",
    "StorageClass", "CustomResourceDefinition", "PriorityClass",
    "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration",
}
DEFAULT_NAMESPACE = "default"


class PlanError(Exception):
    """The manifests ask for something the local plan cannot map."""


def kustomize_version(kubectl):
    """(major, minor, patch) of the kustomize inside `kubectl`, or None."""
    out = subprocess.run([kubectl, "version", "--client"], capture_output=True,
                         text=True, check=False).stdout
    m = re.search(r"Kustomize Version: v(\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(x) for x in m.groups()) if m else None


def kubectl_problem(kubectl):
    """Why `kubectl` cannot render these manifests, or None if it can."""
    if not os.path.exists(kubectl):
        return f"{kubectl} not found (bash tools/setup.sh installs kubectl)"
    version = kustomize_version(kubectl)
    if version is None or version < MIN_KUSTOMIZE:
        out = subprocess.run([kubectl, "version", "--client"],
                             capture_output=True, text=True,
                             check=False).stdout.strip().splitlines()
        return ("these manifests need kustomize >= %s (kubectl >= 1.27); "
                "%s has %s (%s)" % (
                    ".".join(map(str, MIN_KUSTOMIZE)), kubectl,
                    "v" + ".".join(map(str, version)) if version
                    else "a kustomize that does not report its version "
                    "(v2, kubectl < 1.21)", out[0] if out else "?"))
    return None


def render(kubectl, directory):
    """The objects `kubectl kustomize directory` renders (warnings fail)."""
    proc = subprocess.run([kubectl, "kustomize", directory],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise PlanError(f"kubectl kustomize {directory} failed:\n{proc.stderr}")
    if proc.stderr.strip():
        raise PlanError(
            f"kubectl kustomize {directory} warned:\n{proc.stderr}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def namespace_of(obj):
    """The namespace `obj` lands in when applied (None: cluster-scoped)."""
    if obj["kind"] in CLUSTER_SCOPED:
        return None
    return obj["metadata"].get("namespace") or DEFAULT_NAMESPACE


def find(objects, kind, name, namespace=None):
    """The object of `kind` and `name` (in `namespace`, when given)."""
    for o in objects:
        if o["kind"] == kind and o["metadata"]["name"] == name and (
                namespace is None or namespace_of(o) == namespace):
            return o
    return None


class Pod:
    """One pod a workload makes: its name, labels, annotations and spec."""

    def __init__(self, workload, name, template, index=None):
        self.workload = workload
        self.name = name
        self.index = index
        meta = template.get("metadata", {})
        self.labels = dict(meta.get("labels", {}))
        self.annotations = dict(meta.get("annotations", {}))
        self.spec = template["spec"]
        self.namespace = namespace_of(workload)
        if index is not None:
            self.annotations[INDEX_ANNOTATION] = str(index)

    @property
    def kind(self):
        return self.workload["kind"]

    def __repr__(self):
        return f"Pod({self.name})"


def pods_of(objects):
    """Every pod the workloads in `objects` would run, in a stable order."""
    pods = []
    for w in objects:
        kind, name = w["kind"], w["metadata"]["name"]
        spec = w.get("spec", {})
        if kind == "StatefulSet":
            for i in range(spec.get("replicas", 1)):
                pods.append(Pod(w, f"{name}-{i}", spec["template"]))
        elif kind == "Deployment":
            for i in range(spec.get("replicas", 1)):
                pods.append(Pod(w, f"{name}-local-{i}", spec["template"]))
        elif kind == "Job":
            completions = spec.get("completions", 1)
            if spec.get("completionMode") == "Indexed":
                for i in range(completions):
                    pods.append(Pod(w, f"{name}-{i}-local", spec["template"],
                                    index=i))
            else:
                for i in range(spec.get("parallelism", 1)):
                    pods.append(Pod(w, f"{name}-local-{i}", spec["template"]))
        elif kind in ("Pod", "DaemonSet", "ReplicaSet", "CronJob"):
            raise PlanError(f"{kind}/{name}: not mapped by the local plan")
    return pods


def _config_data(objects, kind, name, namespace):
    # As the kubelet does: only the pod's own namespace is searched.
    obj = find(objects, kind, name, namespace)
    if obj is None:
        elsewhere = find(objects, kind, name)
        raise PlanError(
            f"{kind} {name} is referenced but not rendered in namespace "
            f"{namespace}" + (f" (it is in {namespace_of(elsewhere)})"
                              if elsewhere is not None else ""))
    if kind == "Secret":
        data = {k: base64.b64decode(v) for k, v in obj.get("data", {}).items()}
        data.update({k: v.encode() for k, v in obj.get("stringData", {}).items()})
        return data
    return {k: v.encode() for k, v in obj.get("data", {}).items()}


def expand(text, env):
    """Kubernetes' $(VAR) expansion: defined variables are replaced, `$$`
    is a literal `$`, anything else is left as written."""
    out = []
    i = 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i) and ")" in text[i:]:
            end = text.index(")", i)
            var = text[i + 2:end]
            if var in env:
                out.append(env[var])
            else:
                out.append(text[i:end + 1])
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _field(pod, path, pod_ip):
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        table = pod.labels if m.group(1) == "labels" else pod.annotations
        if m.group(2) not in table:
            raise PlanError(f"{pod.name}: fieldRef {path}: no such "
                            f"{m.group(1)[:-1]}")
        return table[m.group(2)]
    simple = {
        "metadata.name": pod.name,
        "metadata.namespace": pod.namespace,
        "metadata.uid": f"uid-{pod.name}",
        "status.podIP": pod_ip,
        "status.hostIP": pod_ip,
        "spec.nodeName": "local-node",
        "spec.serviceAccountName": pod.spec.get("serviceAccountName",
                                                "default"),
    }
    if path not in simple:
        raise PlanError(f"{pod.name}: fieldRef {path} not mapped")
    return simple[path]


def container_env(pod, container, objects, pod_ip="127.0.0.1"):
    """The environment the kubelet gives `container` of `pod` (without the
    image's own variables): envFrom first, then env in order, each value
    expanded against the variables before it."""
    env = {}
    for source in container.get("envFrom", []):
        prefix = source.get("prefix", "")
        if "configMapRef" in source:
            data = _config_data(objects, "ConfigMap",
                                source["configMapRef"]["name"], pod.namespace)
        elif "secretRef" in source:
            data = _config_data(objects, "Secret", source["secretRef"]["name"],
                                pod.namespace)
        else:
            raise PlanError(f"{pod.name}: envFrom {source} not mapped")
        for k, v in data.items():
            env[prefix + k] = v.decode()
    for var in container.get("env", []):
        name = var["name"]
        if "value" in var:
            env[name] = expand(var["value"], env)
        elif "valueFrom" in var:
            src = var["valueFrom"]
            if "fieldRef" in src:
                env[name] = _field(pod, src["fieldRef"]["fieldPath"], pod_ip)
            elif "configMapKeyRef" in src:
                ref = src["configMapKeyRef"]
                env[name] = _config_data(objects, "ConfigMap", ref["name"],
                                         pod.namespace)[ref["key"]].decode()
            elif "secretKeyRef" in src:
                ref = src["secretKeyRef"]
                env[name] = _config_data(objects, "Secret", ref["name"],
                                         pod.namespace)[ref["key"]].decode()
            else:
                raise PlanError(f"{pod.name}: env {name}: {src} not mapped")
        else:
            env[name] = ""
    # The Job controller adds the completion index to Indexed Jobs' pods.
    if pod.index is not None and "JOB_COMPLETION_INDEX" not in env:
        env["JOB_COMPLETION_INDEX"] = str(pod.index)
    return env


# Ports for the pods' fixed container ports: below the kernel's ephemeral
# range (32768-60999 here), from which every outgoing connection on the
# machine takes its local port. A port picked there (bind to 0) could be
# taken by another test's client connection before the daemon bound it
# (seen: a scheduler that could not serve metrics, in 1 of 5 runs two at a
# time). Each test process walks its own stretch of the range below, so
# that two at once rarely even try the same port; one in use is skipped.
_PORT_LOW, _PORT_HIGH = 20000, 32768
_next_port = [None]
_given = set()


def free_port():
    span = _PORT_HIGH - _PORT_LOW
    if _next_port[0] is None:
        _next_port[0] = (os.getpid() * 64) % span
    for _ in range(span):
        port = _PORT_LOW + _next_port[0]
        _next_port[0] = (_next_port[0] + 1) % span
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise PlanError(f"no free port in [{_PORT_LOW}, {_PORT_HIGH})")


def _matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v
                                  for k, v in selector.items())


class LocalProcess:
    """One container of one pod, mapped onto this machine."""

    def __init__(self, pod, container, argv, env, probes, grace_s, dirs):
        self.pod = pod
        self.container = container
        self.argv = argv          # with local paths and ports
        self.env = env            # as the container would see it, mapped
        self.probes = probes      # {"readiness"|"liveness": (port, service)}
        self.grace_s = grace_s    # terminationGracePeriodSeconds
        self.dirs = dirs          # mount path -> local folder

    @property
    def name(self):
        return f"{self.pod.name}/{self.container['name']}"


class LocalPlan:
    """Maps the pods of rendered `objects` onto loopback processes.

    binaries: image path of each executable -> local path (e.g.
    "/usr/local/bin/ps_server" -> bazel-bin/server/ps_server).
    root: a scratch folder for the pods' volumes.
    map_mounts: rewrite mount paths in arguments to the local folders (False
    when the folders are mounted at those paths, as in a container).
    """

    def __init__(self, objects, binaries, root, map_mounts=True):
        self.objects = objects
        self.binaries = binaries
        self.root = root
        self.map_mounts = map_mounts
        self.pods = pods_of(objects)
        self.services = [o for o in objects if o["kind"] == "Service"]
        # (pod name, container port) -> local port, for every declared port.
        self.ports = {}
        for pod in self.pods:
            for c in pod.spec.get("containers", []):
                for p in c.get("ports", []):
                    self.ports[(pod.name, p["containerPort"])] = free_port()

    def _container_port(self, pod, port):
        """A Service's targetPort (number or name) on `pod`."""
        for c in pod.spec.get("containers", []):
            for p in c.get("ports", []):
                if port in (p["containerPort"], p.get("name")):
                    return p["containerPort"]
        raise PlanError(f"{pod.name} declares no port {port}")

    def _service_target(self, host, port, namespace):
        """The local port behind Service DNS name `host`:`port` as a pod in
        `namespace` resolves it, or None if `host` names no Service there.
        Accepts `svc` (the pod's own namespace only, as the cluster DNS
        search path has it), `svc.ns`, `svc.ns.svc...` and, for headless
        Services, `pod.svc...`. Only pods of the Service's namespace back
        it."""
        parts = host.split(".")
        for svc in self.services:
            sname = svc["metadata"]["name"]
            ns = namespace_of(svc)
            for lead in (0, 1):  # 1: pod.svc... (a headless Service)
                if len(parts) <= lead or parts[lead] != sname:
                    continue
                rest = parts[lead + 1:]
                if rest not in ([], [ns], [ns, "svc"],
                                [ns, "svc", "cluster", "local"]):
                    continue
                if not rest and ns != namespace:
                    continue
                spec = svc["spec"]
                backing = [p for p in self.pods
                           if p.namespace == ns and
                           _matches(spec.get("selector"), p.labels)]
                if lead == 1:
                    if spec.get("clusterIP") != "None":
                        continue
                    backing = [p for p in backing if p.name == parts[0]]
                if not backing:
                    raise PlanError(f"Service {sname} selects no pod "
                                    f"(asked for {host}:{port})")
                sport = [p for p in spec.get("ports", [])
                         if p["port"] == port]
                if not sport:
                    raise PlanError(f"Service {sname} has no port {port}")
                target = sport[0].get("targetPort", port)
                pod = backing[0]
                return self.ports[(pod.name, self._container_port(pod, target))]
        return None

    def _map_arg(self, pod, arg, dirs):
        # Mount paths -> local folders, in one pass (longest mount first),
        # so that a folder already substituted is not mapped again by a
        # shorter mount such as /tmp when the test's own root lies under it.
        if dirs:
            mounts = sorted(dirs, key=len, reverse=True)
            pattern = "|".join(re.escape(m) for m in mounts)
            arg = re.sub(f"(?<![\\w./-])({pattern})(?=/|$|,)",
                         lambda m: dirs[m.group(1)], arg)

        def listen(m):
            port = int(m.group(2))
            if (pod.name, port) not in self.ports:
                raise PlanError(f"{pod.name} listens on {m.group(0)}, "
                                "which is not a declared container port")
            return f"{m.group(1) or ''}127.0.0.1:{self.ports[(pod.name, port)]}"

        arg = re.sub(r"(tcp://)?(?:0\.0\.0\.0|\*|\[::\]):(\d+)", listen, arg)

        def remote(m):
            local = self._service_target(m.group(2), int(m.group(3)),
                                         pod.namespace)
            if local is None:
                return m.group(0)
            return f"{m.group(1) or ''}127.0.0.1:{local}"

        return re.sub(r"(tcp://)?\b([a-z0-9][a-z0-9.-]*[a-z0-9]):(\d+)\b",
                      remote, arg)

    def _volumes(self, pod):
        """Local folders for the pod's volumes, filled like the kubelet does."""
        folders = {}
        claims = [t["metadata"]["name"] for t in
                  pod.workload["spec"].get("volumeClaimTemplates", [])]
        for v in pod.spec.get("volumes", []) + [{"name": c, "claim": True}
                                                 for c in claims]:
            path = os.path.join(self.root, pod.name, v["name"])
            os.makedirs(path, exist_ok=True)
            if "secret" in v or "configMap" in v:
                kind = "Secret" if "secret" in v else "ConfigMap"
                src = v["secret"] if "secret" in v else v["configMap"]
                name = src["secretName"] if kind == "Secret" else src["name"]
                mode = src.get("defaultMode", 0o644)
                for key, data in _config_data(self.objects, kind, name,
                                              pod.namespace).items():
                    f = os.path.join(path, key)
                    with open(f, "wb") as out:
                        out.write(data)
                    os.chmod(f, mode | 0o600)  # readable by this test's user
            elif not ("emptyDir" in v or "claim" in v or
                      "persistentVolumeClaim" in v):
                raise PlanError(f"{pod.name}: volume {v} not mapped")
            folders[v["name"]] = path
        return folders

    def processes(self):
        """Every container of every pod as a LocalProcess."""
        out = []
        for pod in self.pods:
            if pod.spec.get("initContainers"):
                raise PlanError(f"{pod.name}: init containers not mapped")
            folders = self._volumes(pod)
            for c in pod.spec["containers"]:
                env = container_env(pod, c, self.objects)
                dirs = {}
                for m in c.get("volumeMounts", []):
                    if m["name"] not in folders:
                        raise PlanError(f"{pod.name}: mount of unknown volume "
                                        f"{m['name']}")
                    dirs[m["mountPath"]] = folders[m["name"]]
                # Service names and mount paths in the environment too (a
                # scheduler address, a secret's path), as DNS and the
                # mounts would make them work in the pod.
                env = {k: self._map_arg(pod, v,
                                        dirs if self.map_mounts else {})
                       for k, v in env.items()}
                command = [expand(x, env) for x in c.get("command", [])]
                args = [expand(x, env) for x in c.get("args", [])]
                if not command:
                    raise PlanError(f"{pod.name}: no command (the image has "
                                    "no entrypoint to fall back on)")
                if command[0] not in self.binaries:
                    raise PlanError(f"{pod.name}: no local binary for "
                                    f"{command[0]}")
                argv = [self.binaries[command[0]]] + [
                    self._map_arg(pod, a, dirs if self.map_mounts else {})
                    for a in command[1:] + args]
                leftover = [a for a in argv if re.search(r"\$\([A-Za-z_]", a)]
                if leftover:
                    raise PlanError(f"{pod.name}: unexpanded variables in "
                                    f"{leftover}")
                probes = {}
                for kind in ("readiness", "liveness", "startup"):
                    probe = c.get(kind + "Probe")
                    if probe is None:
                        continue
                    if "grpc" not in probe:
                        raise PlanError(f"{pod.name}: {kind} probe is not gRPC")
                    port = probe["grpc"]["port"]
                    if (pod.name, port) not in self.ports:
                        raise PlanError(f"{pod.name}: {kind} probe on "
                                        f"undeclared port {port}")
                    probes[kind] = (self.ports[(pod.name, port)],
                                    probe["grpc"].get("service", ""))
                grace = pod.spec.get("terminationGracePeriodSeconds", 30)
                out.append(LocalProcess(pod, c, argv, env, probes, grace,
                                        dirs))
        return out


# --- gRPC health checks (grpc.health.v1), without generated code -----------

SERVING = 1
NOT_SERVING = 2


def health_status(port, service, timeout=1.0):
    """The status the process on 127.0.0.1:`port` reports for `service` (1
    SERVING, 2 NOT_SERVING, 3 SERVICE_UNKNOWN...), or None if it does not
    answer. The messages are encoded by hand: HealthCheckRequest is field 1
    (string), HealthCheckResponse field 1 (enum)."""
    import grpc  # python3-grpcio
    name = service.encode()
    request = b"\x0a" + bytes([len(name)]) + name if name else b""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        try:
            reply = check(request, timeout=timeout)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return 3
            return None
    if reply[:1] != b"\x08":
        return 0
    return reply[1]


def copy_tree(src, dst):
    """Copies a runfiles tree (symlinks resolved) to a writable folder."""
    shutil.copytree(src, dst, symlinks=False)
    for dirpath, dirnames, filenames in os.walk(dst):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o644)


def to_json(objects):
    return json.dumps(objects)
