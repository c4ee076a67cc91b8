"""The environment contract (downpour.env): Client.connect() and
JobMember.join() take every omitted argument from DOWNPOUR_* variables,
and an argument given wins; against real daemons with a cluster secret, a
job token and TLS."""

from __future__ import annotations

import os
import subprocess

import pytest

import downpour
from conftest import ROOT, bin_dir, work_dir
from downpour import env
from downpour.local_cluster import LocalCluster


def test_given_arguments_win_and_the_environment_fills_the_rest():
    environ = {env.SCHEDULER: "h:1", env.RANK: "3", env.NAME: "pod-3",
               env.CLUSTER_SECRET_FILE: "/s", env.TLS_CA_FILE: "/ca",
               env.TLS_MUTUAL: "1", env.JOB_TOKEN_FILE: "/t"}
    assert env.scheduler_address(None, environ) == "h:1"
    assert env.scheduler_address("x:2", environ) == "x:2"
    got = env.member_kwargs({"rank": 0, "tls_mutual": False}, environ)
    assert got["rank"] == 0 and got["name"] == "pod-3"
    assert got["cluster_secret_file"] == "/s" and got["tls_ca_file"] == "/ca"
    assert got["tls_mutual"] is False and got["job_token_file"] == "/t"
    assert got["tls_cert_file"] is None
    # A token given outright replaces the file from the environment.
    got = env.member_kwargs({"job_token": "abc"}, environ)
    assert got["job_token"] == "abc" and got["job_token_file"] is None
    assert env.member_kwargs({}, {})["rank"] == -1
    with pytest.raises(ValueError, match="DOWNPOUR_SCHEDULER"):
        env.scheduler_address(None, {})
    with pytest.raises(ValueError, match="DOWNPOUR_RANK"):
        env.member_kwargs({}, {env.RANK: "one"})
    with pytest.raises(ValueError, match="DOWNPOUR_TLS_MUTUAL"):
        env.auth_kwargs({}, {env.TLS_MUTUAL: "maybe"})


def keygen(path):
    if os.path.exists(path):
        os.remove(path)  # ps_keygen never overwrites a secret
    subprocess.run([os.path.join(bin_dir(), "tools", "ps_keygen"),
                    f"--out={path}"], check=True, capture_output=True)
    return path


@pytest.fixture
def environ(monkeypatch):
    for name in list(os.environ):
        if name.startswith("DOWNPOUR_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_secret_rank_and_job_token_from_the_environment(environ):
    d = work_dir("env-secret")
    secret = keygen(os.path.join(d, "cluster.secret"))
    token = os.path.join(d, "job.token")
    with open(token, "w") as f:
        f.write("let-me-in\n")
    wrong = os.path.join(d, "wrong.token")
    with open(wrong, "w") as f:
        f.write("guess\n")
    flags = [f"--cluster_secret_file={secret}"]
    with LocalCluster(bin_dir(), d, num_servers=1,
                      scheduler_flags=flags + [
                          "--num_workers=2", f"--job_token_file={token}"],
                      server_flags=flags) as c:
        environ.setenv(env.SCHEDULER, c.scheduler_address)
        with pytest.raises(downpour.UnauthenticatedError):
            downpour.Client.connect(connect_timeout=5)
        environ.setenv(env.CLUSTER_SECRET_FILE, secret)
        with downpour.Client.connect() as client:
            t = client.create_table("env", num_keys=4, width=2)
            assert client.pull(t, None).shape == (4, 2)
        environ.setenv(env.RANK, "1")
        environ.setenv(env.NAME, "env-worker")
        environ.setenv(env.JOB_TOKEN_FILE, wrong)
        with pytest.raises(downpour.PermissionDeniedError):
            downpour.JobMember.join(register_timeout=5)
        environ.setenv(env.JOB_TOKEN_FILE, token)
        with downpour.JobMember.join() as member:
            assert member.rank == 1
            assert member.start_clock == 0 and not member.resumed
            assert not member.barrier_passed("nothing-yet")
        # An argument given beats the environment.
        with downpour.JobMember.join(rank=0, name="other",
                                     job_token="let-me-in") as member:
            assert member.rank == 0


def test_tls_from_the_environment(environ):
    d = work_dir("env-tls")
    subprocess.run(["bash", os.path.join(ROOT, "tools", "make_test_certs.sh"),
                    d, "node"], check=True, capture_output=True)
    files = {"ca": f"{d}/ca.pem", "cert": f"{d}/node.pem",
             "key": f"{d}/node.key"}
    tls = [f"--tls_ca_file={files['ca']}", f"--tls_cert_file={files['cert']}",
           f"--tls_key_file={files['key']}", "--tls_mutual"]
    with LocalCluster(bin_dir(), d, num_servers=1, scheduler_flags=tls,
                      server_flags=tls) as c:
        environ.setenv(env.SCHEDULER, c.scheduler_address)
        environ.setenv(env.TLS_CA_FILE, files["ca"])
        environ.setenv(env.TLS_MUTUAL, "1")
        # Half a TLS set-up (mutual TLS without a certificate) is refused
        # before any connection.
        with pytest.raises(downpour.InvalidArgumentError):
            downpour.Client.connect(connect_timeout=5)
        environ.setenv(env.TLS_CERT_FILE, files["cert"])
        environ.setenv(env.TLS_KEY_FILE, files["key"])
        with downpour.Client.connect() as client:
            t = client.create_table("tls", num_keys=2, width=1)
            assert client.pull(t, None).shape == (2, 1)
        with downpour.JobMember.join() as member:
            assert member.rank == 0
