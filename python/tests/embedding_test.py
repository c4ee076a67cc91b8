"""downpour.torch's embedding layers against real daemons: forward and
gradients equal torch's on the same values, each distinct id is pulled and
pushed once per batch, prefetched values are at most one step stale, and
the layers train beside DistributedModel under BSP (bit for bit equal to
one process averaging the same gradients), SSP and ASP.

Job workers are threads of this process, each with its own JobMember,
Client and model, as in torch_test.py.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import downpour
import downpour.torch as dpt
from conftest import bin_dir, work_dir
from downpour.local_cluster import LocalCluster

torch.set_num_threads(1)
_names = itertools.count()


def fresh(prefix: str) -> str:
    return f"{prefix}-{next(_names)}"


# The servers' "assign" rule stores the pushed gradient as the row: what a
# push carried can then be read back exactly.
ASSIGN = dpt.ServerOptimizer("assign", {})
SGD1 = dpt.ServerOptimizer("sgd", {"learning_rate": 1.0})


def _splitmix64(x: int) -> int:
    m = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


def test_feature_keys_are_the_documented_hash():
    ids = np.array([0, 1, 7, 2**40 + 3, -1], np.int64)
    for feature in (0, 3, 25):
        salt = (feature * 0xD1B54A32D192ED03) & ((1 << 64) - 1)
        want = [_splitmix64((int(i) & ((1 << 64) - 1)) ^ salt) for i in ids]
        assert dpt.feature_keys(ids, feature).tolist() == want
    assert dpt.feature_keys(np.array([0]))[0] == 0xE220A8397B1DCDAF
    # One feature per column of the last dimension.
    grid = np.array([[5, 5, 5]], np.int64)
    keys = dpt.feature_keys(grid, [0, 1, 2])
    assert keys.shape == (1, 3) and len(set(keys[0].tolist())) == 3
    assert keys[0, 1] == dpt.feature_keys(np.array([5]), 1)[0]
    with pytest.raises(ValueError, match="features"):
        dpt.feature_keys(grid, [0, 1])


def test_initial_rows_are_the_servers(client):
    """downpour.initial_rows computes what a fresh row of the table holds."""
    for init, a, b in [("uniform", -0.05, 0.05), ("normal", 0.0, 1.0),
                       ("constant", 0.5, 0.0)]:
        layer = dpt.Embedding(None, 5, client=client, name=fresh("init"),
                              init=init, init_a=a, init_b=b, init_seed=9)
        ids = torch.tensor([0, 7, -3, 2**50])
        keys = dpt.feature_keys(ids)
        local = downpour.initial_rows(keys, 5, init=init, init_a=a,
                                      init_b=b, init_seed=9)
        assert torch.equal(layer.rows(ids), torch.from_numpy(local)), init


def _reference_bag(layer, num, ids, mode, **kwargs):
    """A torch.nn.EmbeddingBag holding the layer's current rows for ids."""
    ref = torch.nn.EmbeddingBag(num, layer.embedding_dim, mode=mode, **kwargs)
    present = torch.unique(ids)
    with torch.no_grad():
        ref.weight.zero_()
        ref.weight[present] = layer.rows(present)
    return ref, present


@pytest.mark.parametrize("mode,weighted", [("sum", False), ("sum", True),
                                           ("mean", False), ("max", False)])
def test_embedding_bag_equals_torch(client, mode, weighted):
    g = torch.Generator().manual_seed(1)
    layer = dpt.EmbeddingBag(64, 8, mode=mode, client=client,
                             name=fresh("bag"), optimizer=ASSIGN)
    ids = torch.randint(0, 64, (200,), generator=g)
    ids[:50] = ids[50:100]  # plenty of repeats
    offsets = torch.tensor([0, 10, 10, 40, 120, 199])  # an empty bag too
    psw = torch.rand(200, generator=g) if weighted else None
    ref, present = _reference_bag(layer, 64, ids, mode)
    out = layer(ids, offsets, per_sample_weights=psw)
    ref_out = ref(ids, offsets, per_sample_weights=psw)
    upstream = torch.randn(out.shape, generator=g)
    (out * upstream).sum().backward()
    (ref_out * upstream).sum().backward()
    layer.finish()
    pushed = layer.rows(present)  # "assign": the pushed gradient rows
    if mode == "sum":  # the same kernel on the same values: bit for bit
        assert torch.equal(out, ref_out)
        assert torch.equal(pushed, ref.weight.grad[present])
    else:
        torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-6)
        torch.testing.assert_close(pushed, ref.weight.grad[present], rtol=0,
                                   atol=1e-6)
    assert layer.stats()["pushes"] == 1


def test_padding_idx_is_checked_before_a_table_is_declared(client):
    for layer in (dpt.Embedding, dpt.EmbeddingBag):
        name = fresh("pad")
        with pytest.raises(ValueError, match="padding_idx"):
            layer(10, 4, padding_idx=10, client=client, name=name)
        with pytest.raises(ValueError, match="padding_idx"):
            layer(10, 4, padding_idx=-11, client=client, name=name)
        with pytest.raises(downpour.NotFoundError):
            client.open_table(name)
        # Negative counts from the end, as in torch.
        assert layer(10, 4, padding_idx=-1, client=client,
                     name=name).padding_idx == 9


def test_embedding_and_padding_equal_torch(client):
    g = torch.Generator().manual_seed(2)
    layer = dpt.Embedding(40, 6, padding_idx=3, client=client,
                          name=fresh("emb"), optimizer=ASSIGN)
    ids = torch.randint(0, 40, (7, 9), generator=g)
    ids[0, :4] = 3
    before_padding = layer.rows(torch.tensor([3]))
    ref = torch.nn.Embedding(40, 6, padding_idx=3)
    present = torch.unique(ids)
    with torch.no_grad():
        ref.weight[present] = layer.rows(present)
        ref.weight[3] = 0
    out = layer(ids)
    ref_out = ref(ids)
    assert out.shape == (7, 9, 6)
    assert torch.equal(out, ref_out)
    assert torch.equal(out[0, 0], torch.zeros(6))
    upstream = torch.randn(out.shape, generator=g)
    (out * upstream).sum().backward()
    (ref_out * upstream).sum().backward()
    layer.finish()
    others = present[present != 3]
    assert torch.equal(layer.rows(others), ref.weight.grad[others])
    # The padding row took no gradient: "assign" left it as it was.
    assert torch.equal(layer.rows(torch.tensor([3])), before_padding)
    with pytest.raises(IndexError):
        layer(torch.tensor([40]))
    with pytest.raises(IndexError):
        layer(torch.tensor([-1]))


def test_any_64_bit_id_and_eval_mode(client):
    layer = dpt.Embedding(None, 4, client=client, name=fresh("wide"),
                          optimizer=SGD1)
    ids = torch.tensor([2**62 + 11, -5, 0, 2**62 + 11])
    before = layer.rows(ids)
    with torch.no_grad():
        out = layer(ids)  # no gradient: no push
    assert torch.equal(out, before)
    assert torch.equal(out[0], out[3])
    layer.eval()
    layer(ids)
    assert layer.stats()["pushes"] == 0
    layer.train()
    layer(ids).sum().backward()
    layer.finish()
    after = layer.rows(ids)
    # SGD at rate 1: each row moved by its count in the batch.
    torch.testing.assert_close(after, before - torch.tensor(
        [2.0, 1.0, 1.0, 2.0]).unsqueeze(1).expand(4, 4))


@pytest.mark.parametrize("optimizer", [
    dpt.Adagrad(0.3), dpt.RowwiseAdagrad(0.3), dpt.Adam(0.1), dpt.Ftrl(1.0),
    dpt.SGD(10.0)], ids=["adagrad", "rowwise_adagrad", "adam", "ftrl", "sgd"])
def test_every_server_optimizer_trains(client, optimizer):
    """Each rule on the servers brings a regression's loss down."""
    g = torch.Generator().manual_seed(5)
    layer = dpt.Embedding(50, 4, client=client, name=fresh("opt"),
                          optimizer=optimizer, init="uniform", init_a=-0.1,
                          init_b=0.1)
    truth = torch.randn(50, 4, generator=g)
    losses = []
    for _ in range(60):
        ids = torch.randint(0, 50, (16, 3), generator=g)
        loss = F.mse_loss(layer(ids), truth[ids])
        loss.backward()
        losses.append(loss.item())
    layer.finish()
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5]), losses


def test_distinct_ids_pulled_and_pushed_once(cluster):
    """1000 lookups of 10 distinct ids: one pull and one push of 10 rows,
    on the wire too (a dedicated client counts the bytes)."""
    with downpour.Client.connect(cluster.scheduler_address) as c:
        dim = 16
        layer = dpt.FieldEmbedding(4, dim, client=c, name=fresh("dedup"),
                                   optimizer=dpt.RowwiseAdagrad(0.1))
        base = torch.tensor([[1, 2, 3, 4], [5, 6, 1, 2], [7, 8, 3, 4]])
        ids = base.repeat(84, 1)[:250]  # 1000 ids, 10 distinct (field, id)
        distinct = len(set(zip(np.tile(np.arange(4), 250).tolist(),
                               ids.reshape(-1).tolist())))
        assert distinct == 10
        before = c.traffic
        out = layer(ids)
        after_pull = c.traffic
        out.sum().backward()
        layer.finish()
        after_push = c.traffic
        s = layer.stats()
        assert (s["pulls"], s["pushes"]) == (1, 1)
        assert (s["keys_looked_up"], s["keys_pulled"],
                s["keys_pushed"]) == (1000, 10, 10)
        # Two servers: at most a request each way; the rows come back once.
        assert after_pull.requests - before.requests <= 2
        assert after_push.requests - after_pull.requests <= 2
        row_bytes = 10 * dim * 4
        received = after_pull.bytes_received - before.bytes_received
        assert row_bytes <= received < row_bytes + 1024, received
        sent = after_push.bytes_sent - after_pull.bytes_sent
        assert row_bytes + 10 * 8 <= sent < row_bytes + 10 * 8 + 1024, sent


def test_training_equals_torch_adagrad(client):
    """Several steps of EmbeddingBag(sum) with the servers' Adagrad follow
    torch's Adagrad on nn.EmbeddingBag (to float rounding)."""
    g = torch.Generator().manual_seed(3)
    layer = dpt.EmbeddingBag(30, 5, mode="sum", client=client,
                             name=fresh("adagrad"),
                             optimizer=dpt.Adagrad(0.1,
                                                   initial_accumulator=0.0),
                             init="uniform", init_a=-0.5, init_b=0.5)
    everything = torch.arange(30)
    ref = torch.nn.EmbeddingBag(30, 5, mode="sum")
    with torch.no_grad():
        ref.weight.copy_(layer.rows(everything))
    opt = torch.optim.Adagrad(ref.parameters(), lr=0.1, eps=1e-8)
    target = torch.randn(8, 5, generator=g)
    for _ in range(6):
        ids = torch.randint(0, 30, (8, 3), generator=g)
        F.mse_loss(layer(ids), target).backward()
        F.mse_loss(ref(ids), target).backward()
        opt.step()
        opt.zero_grad()
    layer.finish()
    torch.testing.assert_close(layer.rows(everything), ref.weight.detach(),
                               rtol=1e-5, atol=1e-6)


def test_prefetch_is_one_step_stale(client):
    """With SGD at rate 1 and loss = sum of the outputs, a row moves by its
    count in each batch. With prefetch_loader, step c computes on the rows
    after steps 0 .. c - 2: exactly one step of staleness, never two."""
    layer = dpt.Embedding(8, 2, client=client, name=fresh("prefetch"),
                          optimizer=SGD1, init="zeros")
    g = torch.Generator().manual_seed(4)
    batches = [torch.randint(0, 8, (12,), generator=g) for _ in range(10)]
    table = torch.zeros(8, 2)  # the servers' rows, replayed here
    applied = []  # counts of each pushed step, in order
    for c, ids in enumerate(dpt.prefetch_loader(batches, layer.prefetch)):
        out = layer(ids)
        expected = table.clone()
        for counts in applied[:max(0, c - 1)]:
            expected -= counts
        assert torch.equal(out, expected[ids]), f"step {c}"
        out.sum().backward()
        applied.append(torch.bincount(ids, minlength=8).float()
                       .unsqueeze(1).expand(8, 2))
    layer.finish()
    s = layer.stats()
    assert s["max_lag"] == 1
    assert s["prefetch_hits"] == 9 and s["lookups"] == 10
    # Without prefetch a lookup reads every earlier push.
    layer2 = dpt.Embedding(8, 2, client=client, name=fresh("noprefetch"),
                           optimizer=SGD1, init="zeros")
    for ids in batches:
        layer2(ids).sum().backward()
    layer2.finish()
    assert layer2.stats()["max_lag"] == 0
    assert torch.equal(layer2.rows(torch.arange(8)), -sum(applied))


# -- beside DistributedModel --------------------------------------------------------

def job(name, mode, workers, staleness=0):
    flags = [f"--consistency={mode}", f"--num_workers={workers}"]
    if mode == "ssp":
        flags.append(f"--staleness={staleness}")
    return LocalCluster(bin_dir(), work_dir(name), num_servers=2,
                        scheduler_flags=flags)


def run_workers(cluster, n, body):
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


class ClickNet(torch.nn.Module):
    """3 categorical fields through one table, a linear layer on them."""

    def __init__(self, emb):
        super().__init__()
        self.emb = emb
        self.fc = torch.nn.Linear(3 * 4, 1)

    def forward(self, ids, use_embedding=True):
        if use_embedding:
            e = self.emb(ids).reshape(len(ids), -1)
        else:
            e = torch.zeros(len(ids), 12)
        return self.fc(e).squeeze(1)


def click_data(seed, n=512):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 20, (n, 3), generator=g)
    y = ((ids[:, 0] % 3 == 0) | (ids[:, 2] > 12)).float()
    return ids, y


@pytest.mark.parametrize("prefetch,reduce", [(False, "mean"), (True, "mean"),
                                             (False, "sum")])
def test_bsp_beside_distributed_model_equals_one_process(prefetch, reduce):
    """2 workers under BSP, SGD on the servers for both kinds of table: the
    embedding rows and the dense layer equal a single process that averages
    the same gradients (bsp_reduce="sum": sums them for the rows), bit for
    bit (with prefetch: computing each step on the rows of one step
    before). Rank 1 skips the embedding in step 2 (its empty push keeps the
    step going)."""
    workers, steps, batch = 2, 8, 16
    sgd = dpt.SGD(lr=0.5)
    ids_all, y_all = click_data(5)
    torch.manual_seed(7)
    initial_fc = ClickNet(None).fc.state_dict()

    def batch_of(rank, step):
        b = (step * workers + rank) * batch % len(y_all)
        return ids_all[b:b + batch], y_all[b:b + batch]

    def skips(rank, step):
        return rank == 1 and step == 2

    name = f"bsp-emb-{prefetch}-{reduce}"

    def body(i, member, client):
        emb = dpt.FieldEmbedding(3, 4, client=client, name=f"{name}/emb",
                                 optimizer=sgd, init="uniform", init_a=-0.1,
                                 init_b=0.1, bsp_reduce=reduce)
        net = ClickNet(emb)
        if member.rank == 0:
            net.fc.load_state_dict(initial_fc)
        model = dpt.DistributedModel(net, client, member, optimizer=sgd,
                                     name=name)
        seq = [batch_of(member.rank, s) for s in range(steps)]
        loop = enumerate(seq)
        if prefetch:
            loop = enumerate(dpt.prefetch_loader(
                seq, lambda b: emb.prefetch(b[0])))
        for step, (xb, yb) in loop:
            logits = model(xb, use_embedding=not skips(member.rank, step))
            F.binary_cross_entropy_with_logits(logits, yb).backward()
            model.step()
        model.finish()
        return (emb.rows(all_ids),
                {k: v.clone() for k, v in net.fc.state_dict().items()},
                emb.stats())

    all_ids = torch.arange(20).unsqueeze(1).expand(20, 3)
    keys = dpt.feature_keys(all_ids, range(3)).reshape(-1)
    with job(name, "bsp", workers) as cluster:
        # Initial rows are a pure function of (init spec, key, column): a
        # probe table of the same spec shows them.
        with downpour.Client.connect(cluster.scheduler_address) as c:
            probe = dpt.FieldEmbedding(
                3, 4, client=c, name=f"{name}/probe", optimizer=sgd,
                init="uniform", init_a=-0.1, init_b=0.1, follows_job=False)
            initial = probe.rows_of_keys(keys)
        got = run_workers(cluster, workers, body)
    # The single process: rows kept by key, the same dedup and kernels.
    table = {k: r.clone() for k, r in
             zip(keys.view(np.int64).tolist(), initial)}
    fc = ClickNet(None).fc
    fc.load_state_dict(initial_fc)
    history = []  # the table after each step
    for step in range(steps):
        history.append({k: v.clone() for k, v in table.items()})
        read = history[max(0, step - 1)] if prefetch else history[step]
        sums, dense = {}, []
        for rank in range(workers):
            xb, yb = batch_of(rank, step)
            fc.zero_grad(set_to_none=True)
            if skips(rank, step):
                e = torch.zeros(len(xb), 12)
                F.binary_cross_entropy_with_logits(fc(e).squeeze(1),
                                                   yb).backward()
            else:
                k = torch.from_numpy(dpt.feature_keys(xb, range(3))
                                     .reshape(-1).view(np.int64))
                unique, inverse = torch.unique(k, sorted=True,
                                               return_inverse=True)
                w = torch.stack([read[u] for u in unique.tolist()])
                w.requires_grad_(True)
                e = F.embedding(inverse.view(len(xb), 3), w)
                F.binary_cross_entropy_with_logits(
                    fc(e.reshape(len(xb), -1)).squeeze(1), yb).backward()
                for u, gr in zip(unique.tolist(), w.grad * sgd.grad_scale(
                        step)):
                    sums.setdefault(u, []).append((rank, gr))
            dense.append([p.grad.reshape(-1) * sgd.grad_scale(step)
                          for p in fc.parameters()])
        for u, parts in sums.items():
            total = torch.zeros(4)
            by_rank = dict(parts)
            for rank in range(workers):
                total = total + by_rank.get(rank, torch.zeros(4))
            # Under "sum" each worker pushes 2g and the servers halve the
            # sum: exactly g_0 + g_1 (a factor of 2 rounds nothing).
            table[u] = table[u] - 1.0 * (total / workers if reduce == "mean"
                                         else total)
        with torch.no_grad():
            for j, p in enumerate(fc.parameters()):
                total = dense[0][j].clone()
                for rank in range(1, workers):
                    total += dense[rank][j]
                p -= (total / workers).view_as(p)
    want_rows = torch.stack([table[k] for k in keys.view(np.int64).tolist()])
    for rank in range(workers):
        rows, fc_state, stats = got[rank]
        assert torch.equal(rows.reshape(-1, 4), want_rows), rank
        for k, v in fc.state_dict().items():
            assert torch.equal(fc_state[k], v), (rank, k)
        assert stats["max_lag"] == (1 if prefetch else 0)


def test_bsp_reduce_is_checked(client):
    """An unknown bsp_reduce is refused before a table is declared; "sum"
    is refused in a job with elastic seats (its N changes)."""
    name = fresh("reduce")
    with pytest.raises(ValueError, match="bsp_reduce"):
        dpt.Embedding(4, 2, client=client, name=name, bsp_reduce="avg")
    with pytest.raises(downpour.NotFoundError):
        client.open_table(name)
    with LocalCluster(bin_dir(), work_dir("elastic-reduce"), num_servers=1,
                      scheduler_flags=["--consistency=bsp", "--num_workers=1",
                                       "--elastic_workers=1"]) as cluster:

        def body(i, member, c):
            emb = dpt.Embedding(4, 2, client=c, name="elastic/emb",
                                bsp_reduce="sum")
            with pytest.raises(ValueError, match="elastic"):
                net = torch.nn.ModuleList([emb, torch.nn.Linear(2, 1)])
                dpt.DistributedModel(net, c, member, name="elastic")
            return True

        assert run_workers(cluster, 1, body) == {0: True}


@pytest.mark.parametrize("mode", ["ssp", "asp"])
def test_trains_beside_distributed_model(mode):
    workers, steps = 2, 60
    ids_all, y_all = click_data(6, n=1024)

    def body(i, member, client):
        torch.manual_seed(8)
        emb = dpt.FieldEmbedding(3, 4, client=client, name=f"{mode}/emb",
                                 optimizer=dpt.Adagrad(0.2),
                                 init="uniform", init_a=-0.1, init_b=0.1)
        net = ClickNet(emb)
        model = dpt.DistributedModel(net, client, member,
                                     optimizer=dpt.Adagrad(0.1), name=mode)
        losses = []
        for step in range(steps):
            b = (step * workers + member.rank) * 32 % len(y_all)
            loss = F.binary_cross_entropy_with_logits(
                model(ids_all[b:b + 32]), y_all[b:b + 32])
            loss.backward()
            model.step(loss.item(), examples=32)
            losses.append(loss.item())
        model.finish()
        return losses, client.max_staleness

    with job(f"{mode}-emb", mode, workers, staleness=1) as cluster:
        got = run_workers(cluster, workers, body)
    for rank in range(workers):
        losses, staleness = got[rank]
        assert np.mean(losses[-10:]) < 0.8 * np.mean(losses[:10]), losses
        if mode == "ssp":
            assert staleness <= 1


def _psctl_tables(scheduler: str) -> dict:
    """psctl tables -o json, by table name."""
    out = subprocess.run(
        [os.path.join(bin_dir(), "psctl", "psctl"), "tables", "-o", "json",
         f"--scheduler={scheduler}", "--interval_ms=0"],
        check=True, capture_output=True, text=True, timeout=60).stdout
    return {t["spec"]["name"]: t for t in json.loads(out)["tables"]}


@pytest.mark.parametrize("policy,bound", [("asp", None), ("ssp:1", 1)])
def test_hybrid_dense_bsp_embeddings_of_their_own_policy(policy, bound):
    """The hybrid: a BSP job whose dense layer is aggregated per step (bit
    for bit the same on every worker) while its embedding table keeps a
    policy of its own (applied on arrival, staleness bounded by its own
    bound): declared per table, filled in by the scheduler, measured per
    table by the servers and shown by psctl."""
    workers, steps = 2, 30
    ids_all, y_all = click_data(9, n=1024)
    name = fresh("hybrid")

    def body(i, member, client):
        torch.manual_seed(3)
        emb = dpt.FieldEmbedding(3, 4, client=client, name=f"{name}/emb",
                                 optimizer=dpt.Adagrad(0.2),
                                 init="uniform", init_a=-0.1, init_b=0.1,
                                 consistency=policy)
        net = ClickNet(emb)
        model = dpt.DistributedModel(net, client, member,
                                     optimizer=dpt.SGD(lr=0.2), name=name)
        losses = []
        for step in range(steps):
            b = (step * workers + member.rank) * 32 % len(y_all)
            loss = F.binary_cross_entropy_with_logits(
                model(ids_all[b:b + 32]), y_all[b:b + 32])
            loss.backward()
            model.step(loss.item(), examples=32)
            losses.append(loss.item())
        model.finish()
        model.pull()
        return (losses, emb.table.consistency,
                {k: v.clone() for k, v in net.fc.state_dict().items()})

    with job(name, "bsp", workers) as cluster:
        got = run_workers(cluster, workers, body)
        tables = _psctl_tables(cluster.scheduler_address)
    emb_table = tables[f"{name}/emb"]
    assert emb_table["policy"] == policy
    assert emb_table["spec"]["sync_workers"] == 0  # applied on arrival
    dense = [t for n, t in tables.items()
             if n.startswith(f"{name}/") and n != f"{name}/emb"]
    assert dense and all(t["policy"] == "bsp" and
                         t["spec"]["sync_workers"] == workers for t in dense)
    # (proto3 JSON writes 64-bit numbers as strings)
    assert int(emb_table["aggregated_steps"]) == 0
    assert all(int(t["aggregated_steps"]) > 0 for t in dense)
    if bound is not None:
        assert int(emb_table["max_staleness"]) <= bound, emb_table
    # The dense layer: the same on every worker, bit for bit.
    _, consistency0, fc0 = got[0]
    for rank in range(workers):
        losses, consistency, fc = got[rank]
        assert consistency == policy
        for k in fc0:
            assert torch.equal(fc[k], fc0[k]), (rank, k)
        assert np.mean(losses[-10:]) < np.mean(losses[:10]), losses


def test_bounded_embedding_keeps_its_cap(cluster, client):
    """A layer declared with bounds: the servers keep at most the cap in
    memory and evict the least recently used rows beyond it; the ids of
    the last batch are all in memory and read what training made of them,
    not their initial values."""
    name = fresh("bounded")
    cap = 64
    emb = dpt.Embedding(None, 4, client=client, name=name,
                        optimizer=dpt.SGD(0.5), init="constant",
                        init_a=0.0, bounds=dict(max_rows=cap,
                                                eviction="lru"))
    assert emb.table.bounded
    for step in range(20):
        ids = torch.arange(step * 16, step * 16 + 16)  # 320 ids in all
        emb(ids).sum().backward()
    with torch.no_grad():
        last = emb(ids)  # waits for the last push outside a job
    assert torch.all(last == -0.5), last  # trained once, not evicted
    table = _psctl_tables(cluster.scheduler_address)[name]
    assert cap <= int(table["row_cap"]) <= cap + 16  # ceil per range
    assert 0 < int(table["rows"]) <= int(table["row_cap"]), table
    assert int(table["evicted_rows"]) >= 320 - int(table["row_cap"]), table
    # The first ids left memory: they read as initial values again.
    assert torch.all(emb.rows(torch.arange(0, 16)) == 0)
    with pytest.raises(ValueError, match="unknown bounds"):
        dpt.Embedding(None, 4, client=client, name=fresh("bad"),
                      bounds=dict(max_row=10))
