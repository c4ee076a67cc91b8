"""downpour.torch against real daemons: BSP equals a single process averaging
the same gradients, SSP keeps its bound with a slow worker, ASP trains,
and the rules (one backward per step, unused parameters) hold.

Workers are threads of this process, each with its own JobMember, Client
and model (the waits release the GIL, so they run side by side).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import downpour
import downpour.torch as dpt
from conftest import bin_dir, work_dir
from downpour.local_cluster import LocalCluster

torch.set_num_threads(1)


def job(name, mode, workers, staleness=0, backups=0, extra_flags=()):
    flags = [f"--consistency={mode}", f"--num_workers={workers}",
             f"--backup_workers={backups}"] + list(extra_flags)
    if mode == "ssp":
        flags.append(f"--staleness={staleness}")
    return LocalCluster(bin_dir(), work_dir(name), num_servers=2,
                        scheduler_flags=flags)


class Net(torch.nn.Module):
    """Small, with a matrix large enough to be cut into several parts."""

    def __init__(self, unused=False):
        super().__init__()
        self.fc1 = torch.nn.Linear(20, 64)
        self.fc2 = torch.nn.Linear(64, 3)
        self.unused = torch.nn.Linear(4, 4) if unused else None

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def data(seed, n=256):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 20, generator=g)
    w = torch.randn(20, 3, generator=g)
    return x, (x @ w).argmax(1)


def run_workers(cluster, n, body):
    """Runs body(index, member, client) in n threads; re-raises the first
    error."""
    errors, results = [], {}

    def worker(i):
        try:
            with downpour.JobMember.join(cluster.scheduler_address,
                                         name=f"w{i}") as member, \
                    downpour.Client.connect(cluster.scheduler_address) as c:
                results[member.rank] = body(i, member, c)
        except BaseException as e:  # noqa: BLE001 (re-raised below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert all(not t.is_alive() for t in threads), "a worker hung"
    if errors:
        raise errors[0]
    return results


def test_bsp_matches_one_process_averaging(tmp_path):
    workers, steps, batch = 2, 12, 16
    sgd = dpt.SGD(lr=0.1, warmup_steps=4, warmup_from=0.02)
    torch.manual_seed(7)
    initial = Net().state_dict()
    x, y = data(1)

    def batch_of(rank, step):
        b = (step * workers + rank) * batch % len(y)
        return x[b:b + batch], y[b:b + batch]

    def body(i, member, client):
        net = Net()
        if member.rank == 0:
            net.load_state_dict(initial)
        # part_bytes small: fc1.weight goes out in several row ranges.
        model = dpt.DistributedModel(net, client, member, optimizer=sgd,
                                     name="bsp", part_bytes=1024)
        assert member.policy.is_bsp and model.clock == 0
        for step in range(steps):
            xb, yb = batch_of(member.rank, step)
            F.cross_entropy(model(xb), yb).backward()
            model.step()
        model.finish()
        assert client.max_staleness == 0
        return {k: v.clone() for k, v in net.state_dict().items()}

    with job("bsp", "bsp", workers) as cluster:
        got = run_workers(cluster, workers, body)

    # The same arithmetic in one process: scale each gradient by the rate,
    # sum in rank order, divide by N, subtract (the servers' SGD at rate 1).
    ref = Net()
    ref.load_state_dict(initial)
    for step in range(steps):
        grads = []
        for rank in range(workers):
            ref.zero_grad(set_to_none=True)
            xb, yb = batch_of(rank, step)
            F.cross_entropy(ref(xb), yb).backward()
            scale = sgd.grad_scale(step)
            grads.append([torch.mul(p.grad.reshape(-1), scale)
                          for p in ref.parameters()])
        with torch.no_grad():
            for j, p in enumerate(ref.parameters()):
                total = grads[0][j].clone()
                for rank in range(1, workers):
                    total += grads[rank][j]
                p -= (total / workers).view_as(p)
    for rank in range(workers):
        for k, v in ref.state_dict().items():
            assert torch.equal(got[rank][k], v), (rank, k)


def test_ssp_bound_holds_with_a_slow_worker():
    workers, steps, s = 2, 30, 1
    x, y = data(2)

    def body(i, member, client):
        torch.manual_seed(3)
        model = dpt.DistributedModel(Net(), client, member,
                                     optimizer=dpt.Adagrad(lr=0.05),
                                     name="ssp")
        losses = []
        for step in range(steps):
            b = (step * 16) % len(y)
            loss = F.cross_entropy(model(x[b:b + 16]), y[b:b + 16])
            loss.backward()
            if member.rank == 1:
                time.sleep(0.02)  # the straggler
            model.step(loss.item(), examples=16)
            losses.append(loss.item())
        model.finish()
        return client.max_staleness, losses

    with job("ssp", "ssp", workers, staleness=s) as cluster:
        got = run_workers(cluster, workers, body)
    staleness = [got[r][0] for r in range(workers)]
    assert max(staleness) <= s, staleness
    assert max(staleness) >= 1, "the slow worker never made the other wait"
    losses = got[0][1]
    assert np.mean(losses[-5:]) < np.mean(losses[:5])


@pytest.mark.parametrize("pipeline", [True, False])
def test_asp_trains(pipeline):
    workers, steps = 2, 40
    x, y = data(3)

    def body(i, member, client):
        torch.manual_seed(4)
        model = dpt.DistributedModel(Net(), client, member,
                                     optimizer=dpt.Adagrad(lr=0.05),
                                     name=f"asp-{pipeline}",
                                     pipeline=pipeline)
        assert member.policy.is_asp and member.policy.bound is None
        for step in range(steps):
            b = (step * 32) % len(y)
            F.cross_entropy(model(x[b:b + 32]), y[b:b + 32]).backward()
            model.step()
        model.finish()
        model.pull()
        with torch.no_grad():
            return F.cross_entropy(model(x), y).item()

    with job(f"asp-{pipeline}", "asp", workers) as cluster:
        got = run_workers(cluster, workers, body)
    with torch.no_grad():
        torch.manual_seed(4)
        untrained = F.cross_entropy(Net()(x), y).item()
    assert got[0] < 0.8 * untrained, (got, untrained)


def test_rules_of_the_loop():
    x, y = data(4, n=32)

    def body(i, member, client):
        net = Net(unused=True)
        model = dpt.DistributedModel(net, client, member, name="rules")
        # An unused parameter is sent zeros: the BSP step still completes.
        F.cross_entropy(model(x), y).backward()
        model.step()
        assert model.clock == 1
        assert all(p.grad is None for p in net.parameters())
        # A second backward before step() is refused.
        F.cross_entropy(model(x), y).backward()
        with pytest.raises(RuntimeError, match="call step"):
            F.cross_entropy(model(x), y).backward()
        model.step()
        model.finish()
        # Afterwards the module runs on its final values, unsynchronized.
        clock = model.clock
        F.cross_entropy(model(x), y).backward()
        assert model.clock == clock
        with pytest.raises(RuntimeError, match="finish"):
            model.step()
        # Same names, another shape: the tables already exist.
        other = torch.nn.Module()
        other.fc1 = torch.nn.Linear(20, 5)
        with pytest.raises(downpour.AlreadyExistsError):
            dpt.DistributedModel(other, client, member, name="rules")
        return True

    with job("rules", "bsp", 1) as cluster:
        assert run_workers(cluster, 1, body) == {0: True}


def test_job_member_basics():
    with job("member", "ssp", 2, staleness=2) as cluster:
        a = downpour.JobMember.join(cluster.scheduler_address, name="a")
        b = downpour.JobMember.join(cluster.scheduler_address, name="b")
        assert sorted([a.rank, b.rank]) == [0, 1]
        p = a.policy
        assert (p.kind, p.staleness, p.num_workers, p.total_workers) == (
            "ssp", 2, 2, 2)
        assert p.bound == 2 and p.allows(3, 1) and not p.allows(4, 1)
        assert a.wait_clock(2, timeout=5) >= 0  # within the bound at once
        a.report_clock(3, loss=0.5, examples=30)
        a.flush(timeout=10)
        assert a.reported_clock == 3
        with pytest.raises(downpour.DeadlineExceededError):
            a.wait_clock(3, timeout=0.3)  # b is still at clock 0
        b.report_clock(1, loss=0.5, examples=10)
        b.flush(timeout=10)
        assert a.wait_clock(3, timeout=10) >= 1
        with pytest.raises(downpour.AlreadyExistsError):
            downpour.JobMember.join(cluster.scheduler_address, name="a")
        with pytest.raises(downpour.ResourceExhaustedError):
            downpour.JobMember.join(cluster.scheduler_address, name="c")
        done = []
        t = threading.Thread(target=lambda: done.append(
            b.barrier("x", timeout=10)))
        t.start()
        a.barrier("x", timeout=10)
        t.join(timeout=10)
        assert done == [None]
        a.leave()
        with pytest.raises(downpour.FailedPreconditionError):
            a.report_clock(1)
        b.leave()


def test_epoch_sampler_splits_each_epoch_over_the_workers_present():
    """Every index once per epoch through a join and a leave for good."""
    n = 101
    with LocalCluster(bin_dir(), work_dir("epoch_sampler"), num_servers=1,
                      scheduler_flags=["--consistency=asp", "--num_workers=2",
                                       "--elastic_workers=1"]) as cluster:
        # A table, so that the server is up before the test ends (a server
        # stopped while it starts exits by the signal).
        with downpour.Client.connect(cluster.scheduler_address) as client:
            client.create_table("w", num_keys=4, width=1)
        join = lambda name: downpour.JobMember.join(  # noqa: E731
            cluster.scheduler_address, name=name)
        a, b = join("a"), join("b")
        samplers = {"a": dpt.EpochSampler(a, n, seed=3),
                    "b": dpt.EpochSampler(b, n, seed=3)}
        with pytest.raises(RuntimeError):
            len(samplers["a"])  # no epoch yet
        seen = {e: [] for e in range(3)}

        def take(name, epoch):
            samplers[name].set_epoch(epoch)
            seen[epoch].extend(samplers[name])
            return len(samplers[name])

        assert take("a", 0) == 51
        c = join("c")  # during epoch 0: none of it
        samplers["c"] = dpt.EpochSampler(c, n, seed=3)
        assert take("c", 0) == 0
        assert take("b", 0) == 50
        for name in ("c", "a", "b"):  # epoch 1: all three
            take(name, 1)
        b.leave(for_good=True)
        for name in ("a", "c"):  # epoch 2: a and c
            take(name, 2)
        for e in range(3):
            assert sorted(seen[e]) == list(range(n)), f"epoch {e}"
        # The same permutation on every worker, another in each epoch.
        assert seen[1] != seen[2]
        a.leave(finished=True)
        c.leave(finished=True)


def test_leave_tells_the_scheduler_at_once():
    # Heartbeats would take a minute to be missed: only leave() can make
    # the scheduler act within seconds.
    flags = ["--dead_after_ms=60000", "--worker_replace_timeout_ms=300",
             "--on_worker_loss=stop"]
    with job("leave", "ssp", 3, staleness=1, extra_flags=flags) as cluster:
        a = downpour.JobMember.join(cluster.scheduler_address, name="a")
        b = downpour.JobMember.join(cluster.scheduler_address, name="b")
        c = downpour.JobMember.join(cluster.scheduler_address, name="c")
        # Finished: no loss, nothing to replace. (At most s + 1 ahead of
        # the others: the scheduler refuses more.)
        c.report_clock(2)
        c.leave(finished=True, reason="done")
        c.leave()  # a second call does nothing
        with pytest.raises(downpour.FailedPreconditionError):
            c.report_clock(3)
        a.report_clock(1)
        a.flush(timeout=10)
        b.report_clock(1)
        b.flush(timeout=10)
        assert a.wait_clock(2, timeout=10) >= 1
        # Not finished: its rank waits 0.3 s for a replacement, then the
        # job stops, naming b.
        start = time.monotonic()
        b.leave(reason="unit test")
        with pytest.raises(downpour.AbortedError, match="worker 'b'.*unit test"):
            while True:
                a.report_clock(a.reported_clock + 1)
                a.flush(timeout=10)
                a.wait_clock(a.reported_clock, timeout=10)
                assert time.monotonic() - start < 20, "the job went on"
        assert time.monotonic() - start < 20


def test_bsp_backup_worker_pulls_after_a_late_push():
    # N = 1 + 1 backup: each step takes the first gradient to arrive; the
    # other is discarded, and that worker pulls before its next step.
    steps = 15
    x, y = data(5)

    def body(i, member, client):
        torch.manual_seed(6)
        model = dpt.DistributedModel(Net(), client, member,
                                     optimizer=dpt.SGD(lr=0.05),
                                     name="backup")
        assert member.policy.backup_workers == 1
        while model.clock < steps:
            b = (model.clock * 16) % len(y)
            F.cross_entropy(model(x[b:b + 16]), y[b:b + 16]).backward()
            if member.rank == 1:
                time.sleep(0.01)
            model.step()
        model.finish()
        return client.discarded_pushes

    with job("backup", "bsp", 1, backups=1) as cluster:
        got = run_workers(cluster, 2, body)
    assert sum(got.values()) >= 1, got
