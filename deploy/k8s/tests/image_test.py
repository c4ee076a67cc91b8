#!/usr/bin/python3
"""The image builds from deploy/Containerfile and its daemons run the dev
overlay's job in containers.

Steps (each says why it skips where it cannot run here):
  1. A Debian 12 base image without a registry: `debootstrap --variant=minbase
     bookworm` from Debian's archive, `podman import`ed as
     localhost/downpour-debian:12 (kept, and its root filesystem cached under
     /var/cache/downpour-image, for later runs).
  2. `podman build -f deploy/Containerfile` with PREBUILT: the runtime stage
     as written (the Debian packages runtime_packages.sh finds with ldd, the
     non-root user), from the binaries Bazel built for this test. Setting
     DOWNPOUR_IMAGE_FULL_BUILD=1 builds the build stage too (Bazel inside the
     container; long).
  3. The image runs as user 10001, every binary's libraries resolve in it,
     and its psctl is the repository's VERSION.
  4. The dev overlay's pods run as containers of that image with their exact
     commands, arguments and environment (k8s_pods.LocalPlan, host network
     with distinct loopback ports), as Kubernetes would run them: read-only
     root filesystem, all capabilities dropped, no privilege escalation, the
     Secret mounted read-only and readable through the pod's fsGroup. The
     worker must finish with exit 0, every container must pass its gRPC
     probes, and the scheduler and server must exit 0 on SIGTERM.

With DOWNPOUR_IMAGE_PYTHON=1 it also builds the `python` target (Python 3,
Debian's PyTorch, the downpour package; a large download) and imports
downpour and torch in it as user 10001.

This machine may refuse containers' default resource limits (no
CAP_SYS_RESOURCE) or crun's cgroup set-up; the test then uses runc with
lowered limits, the way that works here.
"""

import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import k8s_pods  # noqa: E402

KUBECTL = "/usr/bin/kubectl"
PODMAN = "/usr/bin/podman"
DEBOOTSTRAP = "/usr/sbin/debootstrap"
BASE = "localhost/downpour-debian:12"
IMAGE = "localhost/downpour:image-test"
PYTHON_IMAGE = "localhost/downpour-python:image-test"
CACHE = os.environ.get("DOWNPOUR_IMAGE_CACHE", "/var/cache/downpour-image")
BINARIES = {
    "ps_scheduler": "scheduler/ps_scheduler",
    "ps_server": "server/ps_server",
    "ps_worker": "worker/ps_worker",
    "ps_lbfgs": "lbfgs/ps_lbfgs",
    "ps_keygen": "tools/ps_keygen",
    "psctl": "psctl/psctl",
}
FS_GROUP = 10001


def runfile(rel):
    return os.path.join(os.environ["TEST_SRCDIR"],
                        os.environ.get("TEST_WORKSPACE", "downpour"), rel)


class Skip(Exception):
    pass


class Failure(Exception):
    pass


def run(cmd, timeout=600, check=True, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          **kw)
    if check and proc.returncode != 0:
        raise Failure(f"{' '.join(cmd)} exited {proc.returncode}:\n"
                      f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def base_image():
    if run([PODMAN, "image", "exists", BASE], check=False).returncode == 0:
        return
    rootfs = os.path.join(CACHE, "rootfs")
    if not os.path.isdir(os.path.join(rootfs, "usr")):
        if not os.path.exists(DEBOOTSTRAP):
            raise Skip("no base image and no debootstrap to make one "
                       "(bash tools/setup.sh installs it)")
        os.makedirs(CACHE, exist_ok=True)
        partial = rootfs + ".partial"
        shutil.rmtree(partial, ignore_errors=True)
        print("debootstrap --variant=minbase bookworm (a few minutes)")
        # Bazel runs tests with PATH=/bin:/usr/bin:/usr/local/bin;
        # debootstrap needs the sbin tools (chroot, ...).
        env = dict(os.environ, PATH="/usr/sbin:/usr/bin:/sbin:/bin")
        proc = run([DEBOOTSTRAP, "--variant=minbase", "bookworm", partial,
                    "http://deb.debian.org/debian"], timeout=1800, check=False,
                   env=env)
        if proc.returncode != 0:
            raise Skip("debootstrap could not make a Debian 12 root "
                       f"filesystem:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        os.rename(partial, rootfs)
    tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."],
                           stdout=subprocess.PIPE)
    imp = subprocess.run([PODMAN, "import", "-", BASE], stdin=tar.stdout,
                         capture_output=True, text=True, timeout=600)
    tar.wait()
    if imp.returncode != 0:
        raise Failure(f"podman import failed: {imp.stderr}")


def runtime_flags():
    """The podman flags that let a container start on this machine."""
    tried = []
    for flags in ([], ["--runtime", "runc", "--ulimit", "nofile=8192:8192",
                       "--ulimit", "nproc=4096:4096"]):
        proc = run([PODMAN, "run", "--rm", "--network=host"] + flags +
                   [BASE, "true"], check=False, timeout=120)
        if proc.returncode == 0:
            return flags
        tried.append(f"podman run {' '.join(flags) or '(defaults)'}: "
                     f"{proc.stderr.strip()[-500:]}")
    raise Skip("podman cannot start a container here:\n" + "\n".join(tried))


def build_image(flags, tmp, target="runtime", tag=IMAGE):
    ctx = os.path.join(tmp, "context-" + target)
    prebuilt = os.path.join(ctx, "prebuilt")
    os.makedirs(os.path.join(prebuilt, "bin"))
    os.makedirs(os.path.join(prebuilt, "lib"))
    package = os.path.join(prebuilt, "python", "downpour")
    os.makedirs(package)
    src = os.path.dirname(runfile("python/downpour/__init__.py"))
    for f in os.listdir(src):
        if f.endswith((".py", ".pyi", ".so")) or f == "py.typed":
            shutil.copy(os.path.join(src, f), package)
    os.makedirs(os.path.join(ctx, "tools"))
    shutil.copy(runfile("tools/setup.sh"), os.path.join(ctx, "tools"))
    bins = []
    for name, rel in BINARIES.items():
        dst = os.path.join(prebuilt, "bin", name)
        shutil.copy(runfile(rel), dst)
        os.chmod(dst, 0o755)
        bins.append(dst)
    foreign = os.path.join(tmp, "foreign")
    pkgs = run(["bash", runfile("deploy/runtime_packages.sh"),
                f"--foreign={foreign}"] + bins +
               [os.path.join(package, "_downpour.so")]).stdout
    with open(os.path.join(prebuilt, "runtime-packages"), "w") as f:
        f.write(pkgs)
    with open(foreign) as f:
        for lib in f.read().split():
            # Not from Debian (CUDA's, where nvcc built the GPU MLP): the
            # image carries them, as a GPU image must.
            shutil.copy(lib, os.path.join(prebuilt, "lib"))
    print("runtime packages:", " ".join(pkgs.split()))
    full = os.environ.get("DOWNPOUR_IMAGE_FULL_BUILD") == "1"
    cmd = [PODMAN, "build", "--network=host"] + flags + [
        "-f", runfile("deploy/Containerfile"),
        "--build-arg", f"DEBIAN_IMAGE={BASE}",
        "--build-arg", f"DEBIAN_SLIM_IMAGE={BASE}",
        "--target", target, "-t", tag]
    if full:
        ctx = os.path.dirname(os.path.dirname(os.path.realpath(
            runfile("deploy/Containerfile"))))
        # This machine's Bazel disk cache (.bazelrc), if any, spares the
        # build stage most compiles; the image does not keep it.
        cache = os.path.join(pwd.getpwuid(os.getuid()).pw_dir, ".cache",
                             "downpour-bazel")
        if os.path.isdir(cache):
            cmd += ["-v", f"{cache}:/root/.cache/downpour-bazel"]
    else:
        cmd += ["--build-arg", "PREBUILT=prebuilt"]
    start = time.time()
    run(cmd + [ctx], timeout=3600)
    print(f"podman build ({'full' if full else 'prebuilt'}): "
          f"{time.time() - start:.0f} s")


def check_image(flags):
    user = run([PODMAN, "image", "inspect", "--format", "{{.Config.User}}",
                IMAGE]).stdout.strip()
    if user != "10001:10001":
        raise Failure(f"image user is '{user}', not 10001:10001")
    out = run([PODMAN, "run", "--rm", "--network=host"] + flags +
              ["--entrypoint", "/bin/sh", IMAGE, "-c",
               "id -u; for b in /usr/local/bin/ps*; do "
               "ldd $b | grep 'not found' && echo MISSING $b; done; "
               "ls /usr/share/datasets/fashion-mnist | wc -l"]).stdout
    lines = out.split()
    with open(runfile("VERSION")) as f:
        version = f.read().strip()
    got = run([PODMAN, "run", "--rm", "--network=host"] + flags +
              ["--entrypoint", "/usr/local/bin/psctl", IMAGE,
               "version"]).stdout.strip()
    if got != f"psctl {version}":
        raise Failure(f"the image's psctl says '{got}', VERSION {version}")
    if lines[0] != "10001":
        raise Failure(f"the image runs as uid {lines[0]}")
    if "MISSING" in out:
        raise Failure(f"libraries missing in the image:\n{out}")
    print(f"image: user 10001, every binary's libraries present, "
          f"{lines[-1]} Fashion-MNIST files")


def check_python_image(flags, tmp):
    """The python target: downpour and torch import as user 10001, and
    downpour.__version__ is VERSION."""
    build_image(flags, tmp, target="python", tag=PYTHON_IMAGE)
    with open(runfile("VERSION")) as f:
        version = f.read().strip()
    out = run([PODMAN, "run", "--rm", "--network=host", "--read-only",
               "--user", "10001:10001"] + flags +
              [PYTHON_IMAGE, "/usr/bin/python3", "-c",
               "import downpour, downpour.torch, torch; "
               "print(downpour.__version__, torch.__version__)"]).stdout
    if out.split()[0] != version:
        raise Failure(f"the python image's downpour is {out!r}, not {version}")
    print(f"python image: downpour {version}, torch {out.split()[1]}")


def run_dev(flags, tmp):
    k8s = os.path.join(tmp, "k8s")
    k8s_pods.copy_tree(runfile("deploy/k8s"), k8s)
    run([runfile("tools/ps_keygen"),
         f"--out={k8s}/overlays/dev/cluster.secret"])
    objects = k8s_pods.render(KUBECTL, os.path.join(k8s, "overlays/dev"))
    identity = {f"/usr/local/bin/{b}": f"/usr/local/bin/{b}" for b in BINARIES}
    root = os.path.join(tmp, "pods")
    plan = k8s_pods.LocalPlan(objects, identity, root, map_mounts=False)
    procs = plan.processes()
    # fsGroup: volumes belong to the pod's group, as the kubelet sets them.
    for dirpath, dirnames, filenames in os.walk(root):
        os.chown(dirpath, 0, FS_GROUP)
        os.chmod(dirpath, 0o2775)
        for f in filenames:
            os.chown(os.path.join(dirpath, f), 0, FS_GROUP)
            os.chmod(os.path.join(dirpath, f), 0o440)
    names = {}
    try:
        for p in procs:
            name = f"downpour-image-test-{p.pod.name}"
            names[p.pod.name] = name
            run([PODMAN, "rm", "-f", name], check=False)
            cmd = [PODMAN, "run", "-d", "--name", name, "--network=host",
                   "--read-only", "--cap-drop=ALL",
                   "--security-opt=no-new-privileges", "--user", "10001:10001",
                   "--group-add", str(FS_GROUP)] + flags
            for mount, folder in p.dirs.items():
                readonly = any(m["mountPath"] == mount and m.get("readOnly")
                               for m in p.container.get("volumeMounts", []))
                cmd += ["-v", f"{folder}:{mount}" + (":ro" if readonly else "")]
            for k, v in p.env.items():
                cmd += ["-e", f"{k}={v}"]
            cmd += ["--entrypoint", p.argv[0], IMAGE] + p.argv[1:]
            print("container", p.pod.name, ":", " ".join(p.argv))
            run(cmd)
        seen = {p.pod.name: set() for p in procs}
        deadline = time.time() + 300
        done = set()
        while time.time() < deadline:
            for p in procs:
                if p.pod.name in done:
                    continue
                for kind in ("readiness", "liveness"):
                    if kind in p.probes and kind not in seen[p.pod.name]:
                        port, service = p.probes[kind]
                        if k8s_pods.health_status(port, service, 0.5) == \
                                k8s_pods.SERVING:
                            seen[p.pod.name].add(kind)
                state = run([PODMAN, "inspect", "--format",
                             "{{.State.Status}} {{.State.ExitCode}}",
                             names[p.pod.name]]).stdout.split()
                if state[0] == "exited":
                    logs = run([PODMAN, "logs", names[p.pod.name]],
                               check=False).stderr[-3000:]
                    if p.pod.kind != "Job" or state[1] != "0":
                        raise Failure(f"{p.pod.name} exited {state[1]}:\n{logs}")
                    done.add(p.pod.name)
                    print(f"{p.pod.name} exited 0")
            if all(p.pod.name in done for p in procs if p.pod.kind == "Job"):
                break
            time.sleep(0.2)
        else:
            raise Failure("the job did not finish in 300 s")
        for p in procs:
            missing = {"readiness", "liveness"} - seen[p.pod.name]
            if missing:
                raise Failure(f"{p.pod.name}: never seen {missing}")
        for p in procs:
            if p.pod.name in done:
                continue
            run([PODMAN, "stop", "-t", str(p.grace_s), names[p.pod.name]],
                timeout=p.grace_s + 30)
            code = run([PODMAN, "inspect", "--format", "{{.State.ExitCode}}",
                        names[p.pod.name]]).stdout.strip()
            if code != "0":
                raise Failure(f"{p.pod.name} exited {code} on SIGTERM")
            print(f"{p.pod.name} stopped on SIGTERM, exit 0")
        worker_log = run([PODMAN, "logs", names["downpour-worker-0-local"]],
                         check=False)
        text = worker_log.stdout + worker_log.stderr
        m = re.findall(r"test accuracy ([0-9.]+)", text)
        if not m:
            raise Failure(f"the worker evaluated nothing:\n{text[-2000:]}")
        print(f"worker in the image: test accuracy {m[-1]}")
    finally:
        for name in names.values():
            run([PODMAN, "rm", "-f", name], check=False)


def main():
    sys.stdout.reconfigure(line_buffering=True)  # progress in the test log
    try:
        if not os.path.exists(PODMAN):
            raise Skip(f"{PODMAN} not installed (bash tools/setup.sh "
                       "installs podman)")
        problem = k8s_pods.kubectl_problem(KUBECTL)
        if problem:
            raise Skip(problem)
        if os.geteuid() != 0:
            raise Skip("not root: this test uses rootful podman (debootstrap, "
                       "fsGroup ownership)")
        base_image()
        flags = runtime_flags()
        print("podman flags that work here:", " ".join(flags) or "(none)")
        tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        os.chmod(tmp, 0o755)
        build_image(flags, tmp)
        try:
            check_image(flags)
            run_dev(flags, tmp)
            if os.environ.get("DOWNPOUR_IMAGE_PYTHON") == "1":
                check_python_image(flags, tmp)
        finally:
            run([PODMAN, "rmi", "-f", PYTHON_IMAGE], check=False)
            # Each build leaves its build stage (~1.4 GB with CUDA's
            # libraries) as a dangling image; the base stays for next time.
            run([PODMAN, "rmi", "-f", IMAGE], check=False)
            run([PODMAN, "image", "prune", "-f"], check=False)
    except Skip as e:
        print(f"SKIPPED: {e}")
        return 0
    except (Failure, k8s_pods.PlanError, subprocess.TimeoutExpired) as e:
        print(f"FAIL: {e}")
        return 1
    print("PASS: image built, checked, and ran the dev job")
    return 0


if __name__ == "__main__":
    sys.exit(main())
