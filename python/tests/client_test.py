"""The Python client against real daemons: every operation, the key and
value forms, asynchronous use, the GIL, and errors with their exact codes."""

from __future__ import annotations

import ast
import os
import random
import re
import subprocess
import threading
import time

import numpy as np
import pytest

import downpour
from downpour import StatusCode

_names = iter(range(1_000_000))


def fresh(prefix: str) -> str:
    return f"{prefix}-{next(_names)}"


def dense(client, rows=100, width=4, **kw):
    return client.create_table(fresh("dense"), num_keys=rows, width=width,
                               **kw)


def test_put_get_every_key_form(client):
    t = dense(client, rows=100, width=4)
    assert (t.num_keys, t.width, t.sparse) == (100, 4, False)
    values = np.arange(400, dtype=np.float32).reshape(100, 4)
    assert client.put(t, None, values) is None
    np.testing.assert_array_equal(client.get(t, None), values)
    np.testing.assert_array_equal(client.get(t, range(10, 20)), values[10:20])
    # Batches in any order, with repeats: list, uint64 array, int64 array.
    batch = [99, 3, 3, 50]
    np.testing.assert_array_equal(client.get(t, batch), values[batch])
    np.testing.assert_array_equal(
        client.get(t, np.array(batch, dtype=np.uint64)), values[batch])
    np.testing.assert_array_equal(
        client.get(t, np.array(batch, dtype=np.int64)), values[batch])
    np.testing.assert_array_equal(client.get(t, 7), values[7:8])
    assert client.get(t, []).shape == (0, 4)
    assert client.get(t, range(5, 5)).shape == (0, 4)


def test_out_is_filled_in_place(client):
    t = dense(client, rows=10, width=3)
    client.put(t, range(0, 10), np.ones(30, dtype=np.float32))
    out = np.zeros((10, 3), dtype=np.float32)
    result = client.get(t, None, out)
    assert result is out
    np.testing.assert_array_equal(out, np.ones((10, 3)))
    flat = np.zeros(6, dtype=np.float32)  # any shape with the right size
    assert client.pull(t, [1, 2], out=flat) is flat
    np.testing.assert_array_equal(flat, np.ones(6))


def test_values_are_converted_when_not_float32(client):
    t = dense(client, rows=4, width=2)
    client.put(t, None, [[1, 2], [3, 4], [5, 6], [7, 8]])  # ints, a list
    client.add(t, None, np.full((4, 2), 0.5, dtype=np.float64))
    strided = np.arange(16, dtype=np.float32)[::2]  # not contiguous
    client.add(t, None, strided)
    expected = (np.arange(1, 9, dtype=np.float32) + 0.5 +
                np.arange(16, dtype=np.float32)[::2]).reshape(4, 2)
    np.testing.assert_array_equal(client.get(t, None), expected)


def test_push_applies_the_handler(client):
    t = dense(client, rows=8, width=2, init="constant", init_a=1.0,
              handler="sgd", handler_params={"learning_rate": 0.5})
    np.testing.assert_array_equal(client.pull(t, None), np.ones((8, 2)))
    client.push(t, range(0, 4), np.full(8, 2.0, dtype=np.float32))
    got = client.pull(t, None)
    np.testing.assert_array_equal(got[:4], np.zeros((4, 2)))  # 1 - 0.5 * 2
    np.testing.assert_array_equal(got[4:], np.ones((4, 2)))
    after = client.push_pull(t, [6, 0], np.ones(4, dtype=np.float32))
    np.testing.assert_array_equal(after, [[0.5, 0.5], [-0.5, -0.5]])


def test_non_finite_pushes_are_refused_unless_allowed(client):
    t = dense(client, rows=4, width=2, init="constant", init_a=1.0,
              handler="sgd", handler_params={"learning_rate": 1.0})
    assert not t.allow_non_finite
    grads = np.zeros((4, 2), np.float32)
    grads[2, 1] = np.nan
    with pytest.raises(downpour.InvalidArgumentError) as e:
        client.push(t, None, grads)
    assert e.value.code == StatusCode.INVALID_ARGUMENT
    assert "key 2 (column 1)" in e.value.message and t.name in e.value.message
    with pytest.raises(downpour.InvalidArgumentError):
        client.push_pull(t, [3], np.array([np.inf, 0], np.float32))
    # Refused before anything changed.
    np.testing.assert_array_equal(client.pull(t, None), np.ones((4, 2)))

    loose = dense(client, rows=4, width=2, handler="sum",
                  allow_non_finite=True)
    assert loose.allow_non_finite
    client.push(loose, None, grads)
    got = client.get(loose, None)
    assert np.isnan(got[2, 1]) and np.count_nonzero(np.isnan(got)) == 1


def test_a_table_that_sums_repeats_applies_each_key_once(client):
    def table(sum_repeats):
        return client.create_table(
            fresh("summed"), sparse=True, width=2, handler="adagrad",
            handler_params={"learning_rate": 0.5}, sum_repeats=sum_repeats)
    summed, by_hand, each = table(True), table(False), table(False)
    assert summed.sum_repeats and not each.sum_repeats
    keys = np.array([7, 9, 7, 7, 2**63], dtype=np.uint64)
    grads = np.array([[1, 2], [3, 4], [0.5, 0.25], [2, 1], [1, 1]],
                     np.float32)
    client.push(summed, keys, grads)
    # Rows summed in batch order: 7's is 1 + 0.5 + 2, 2 + 0.25 + 1.
    sums = np.array([[(1 + 0.5) + 2, (2 + 0.25) + 1], [3, 4], [1, 1]],
                    np.float32)
    distinct = np.array([7, 9, 2**63], dtype=np.uint64)
    client.push(by_hand, distinct, sums)
    client.push(each, keys, grads)
    got = client.pull(summed, distinct)
    np.testing.assert_array_equal(got, client.pull(by_hand, distinct))
    assert not np.array_equal(got, client.pull(each, distinct))


def test_sparse_table(client):
    t = client.create_table(fresh("sparse"), sparse=True, width=2,
                            handler="sum")
    assert t.sparse
    keys = np.array([2**63 + 5, 17, 2**40], dtype=np.uint64)
    client.push(t, keys, np.arange(6, dtype=np.float32))
    np.testing.assert_array_equal(client.get(t, [17, 2**63 + 5, 3]),
                                  [[2, 3], [0, 1], [0, 0]])
    with pytest.raises(ValueError, match="sparse"):
        client.get(t, None)
    # Ranges reach the top of the 64-bit key space.
    top = 2**64 - 1
    client.put(t, range(top - 3, top), np.ones(6, np.float32))
    np.testing.assert_array_equal(client.get(t, range(top - 4, top)),
                                  [[0, 0], [1, 1], [1, 1], [1, 1]])
    with pytest.raises(ValueError, match="64 bits"):
        client.get(t, range(0, 2**64))


def test_async_operations(client):
    t = dense(client, rows=1000, width=8)
    ops = [client.put(t, range(i * 100, (i + 1) * 100),
                      np.full(800, i, dtype=np.float32), async_op=True)
           for i in range(10)]
    assert all(isinstance(op, downpour.Operation) for op in ops)
    for op in ops:
        assert op.wait(timeout=20) is None
        assert op.is_completed()
    out = np.empty((1000, 8), dtype=np.float32)
    op = client.get(t, None, out, async_op=True)
    assert client.wait(op) is out
    assert op.wait() is out  # waiting again returns the same result
    np.testing.assert_array_equal(out[:, 0], np.repeat(np.arange(10), 100))
    # Dropped without wait(): the destructor waits, the write lands.
    client.put(t, [0], np.full(8, 42, dtype=np.float32), async_op=True)
    np.testing.assert_array_equal(client.get(t, [0]), np.full((1, 8), 42))


def test_async_error_raised_by_wait(client):
    t = dense(client, rows=10, width=1)
    op = client.get(t, range(5, 20), async_op=True)
    with pytest.raises(downpour.OutOfRangeError) as e:
        op.wait()
    assert e.value.code == StatusCode.OUT_OF_RANGE
    with pytest.raises(downpour.OutOfRangeError):
        op.wait()  # the same error again


def bsp_table(client, name):
    # sync_workers=2: a clocked push_pull is answered only once both
    # workers pushed that clock, so the first caller blocks on the second.
    return client.create_table(name, num_keys=4, width=1, handler="sgd",
                               handler_params={"learning_rate": 1.0},
                               sync_workers=2)


@pytest.mark.parametrize("async_op", [True, False])
def test_gil_is_released_while_waiting(cluster, client, async_op):
    t = bsp_table(client, fresh("bsp"))
    client.set_worker_clock(0, 0)
    second = downpour.Client.connect(cluster.scheduler_address)
    second.set_worker_clock(1, 0)
    results = {}

    def other_worker():
        time.sleep(0.3)  # runs only if the main thread let go of the GIL
        results["other"] = second.push_pull(t, None,
                                            np.full(4, 4, dtype=np.float32))

    thread = threading.Thread(target=other_worker)
    thread.start()
    grads = np.full(4, 2, dtype=np.float32)
    if async_op:
        mine = client.push_pull(t, None, grads, async_op=True).wait(timeout=15)
    else:
        mine = client.push_pull(t, None, grads)
    thread.join(timeout=15)
    assert not thread.is_alive()
    # Mean of 2 and 4, applied once with rate 1: 0 - 3.
    np.testing.assert_array_equal(mine, np.full((4, 1), -3))
    np.testing.assert_array_equal(results["other"], np.full((4, 1), -3))
    second.close()


def test_wait_timeout_leaves_the_operation_running(cluster, client):
    t = bsp_table(client, fresh("bsp"))
    client.set_worker_clock(0, 0)
    op = client.push_pull(t, None, np.ones(4, np.float32), async_op=True)
    with pytest.raises(downpour.DeadlineExceededError) as e:
        op.wait(timeout=0.2)
    assert isinstance(e.value, TimeoutError)
    assert not op.is_completed()
    with downpour.Client.connect(cluster.scheduler_address) as second:
        second.set_worker_clock(1, 0)
        second.push_pull(t, None, np.ones(4, np.float32))
    np.testing.assert_array_equal(op.wait(timeout=15), np.full((4, 1), -1))


def test_threads_share_a_client(client):
    t = dense(client, rows=800, width=2)
    errors = []

    def work(i):
        try:
            keys = range(i * 100, (i + 1) * 100)
            for step in range(20):
                client.put(t, keys, np.full(200, i * 1000 + step, np.float32))
                got = client.get(t, keys)
                assert (got == i * 1000 + step).all()
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not errors
    assert all(not th.is_alive() for th in threads)


def test_errors_carry_code_and_message(cluster, client):
    with pytest.raises(downpour.NotFoundError) as e:
        client.open_table("no-such-table")
    assert isinstance(e.value, LookupError)
    assert e.value.code == StatusCode.NOT_FOUND
    assert "no-such-table" in e.value.message
    assert str(e.value).startswith("NOT_FOUND: ")

    name = fresh("taken")
    t = client.create_table(name, num_keys=10, width=2)
    assert client.create_table(name, num_keys=10, width=2) == t  # idempotent
    assert client.open_table(name) == t
    with pytest.raises(downpour.AlreadyExistsError) as e:
        client.create_table(name, num_keys=10, width=3)
    assert e.value.code == StatusCode.ALREADY_EXISTS

    with pytest.raises(downpour.InvalidArgumentError) as e:
        client.put(t, range(0, 10), np.zeros(19, np.float32))
    assert isinstance(e.value, ValueError)
    assert e.value.code == StatusCode.INVALID_ARGUMENT
    assert name in e.value.message and "19 values" in e.value.message

    with pytest.raises(downpour.InvalidArgumentError) as e:
        client.get(t, [1, 2], out=np.zeros(3, np.float32))
    assert "output holds 3 floats" in e.value.message

    with pytest.raises(downpour.OutOfRangeError) as e:
        client.get(t, [3, 10])
    assert "key 10" in e.value.message
    assert e.value.code == StatusCode.OUT_OF_RANGE

    with pytest.raises(downpour.InvalidArgumentError) as e:
        client.create_table(fresh("bad"), num_keys=4, handler="sgd",
                            handler_params={"learnin_rate": 0.1})
    assert "learnin_rate" in e.value.message

    with pytest.raises(downpour.InvalidArgumentError) as e:
        client.get(t, range(8, 3))
    assert "inverted key range" in e.value.message


def test_malformed_arguments_raise_python_errors(client):
    t = dense(client, rows=10, width=1)
    with pytest.raises(TypeError, match="float32"):
        client.get(t, None, out=np.zeros(10, np.float64))
    with pytest.raises(TypeError, match="float32"):
        client.get(t, None, out=[0.0] * 10)
    read_only = np.zeros(10, np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        client.get(t, None, out=read_only)
    with pytest.raises(ValueError, match="negative key"):
        client.get(t, [1, -1])
    with pytest.raises(ValueError, match="negative key"):
        client.get(t, -3)
    with pytest.raises(ValueError, match="step 1"):
        client.get(t, range(0, 10, 2))
    with pytest.raises(TypeError, match="integers"):
        client.get(t, [1.5, 2.0])
    with pytest.raises(ValueError, match="1-D"):
        client.get(t, np.zeros((2, 2), np.uint64))
    with pytest.raises(ValueError):
        client.put(t, None, ["a"] * 10)


def test_closed_client_and_unreachable_scheduler(cluster):
    c = downpour.Client.connect(cluster.scheduler_address)
    t = c.create_table(fresh("closing"), num_keys=2)
    op = c.put(t, None, np.ones(2, np.float32), async_op=True)
    c.close()
    assert c.closed
    op.wait(timeout=15)  # still completes: it holds the connection
    with pytest.raises(downpour.FailedPreconditionError) as e:
        c.get(t, None)
    assert e.value.code == StatusCode.FAILED_PRECONDITION
    c.close()  # idempotent

    with pytest.raises(downpour.UnavailableError) as e:
        downpour.Client.connect("127.0.0.1:1", connect_timeout=0.5)
    assert isinstance(e.value, ConnectionError)
    assert "127.0.0.1:1" in e.value.message
    with pytest.raises(ValueError):
        downpour.Client.connect("127.0.0.1:1", op_timeout=0)
    for spin in (-1e-6, 0.5, float("nan")):
        with pytest.raises(ValueError, match="spin_wait"):
            downpour.Client.connect("127.0.0.1:1", spin_wait=spin)


def test_a_lone_wait_spins_only_when_asked(cluster):
    """Client.connect's spin_wait reaches Operation.wait: a lone operation's
    wait spins before it sleeps (the first always does, unless its reply is
    already there), and with spin_wait=0 never."""
    still = downpour.Client.connect(cluster.scheduler_address, spin_wait=0)
    spinning = downpour.Client.connect(cluster.scheduler_address)
    t = dense(spinning, rows=4, width=1)
    for c in (still, spinning):
        c.add(t, None, np.ones(4, np.float32))
    # Pulls until one wait has spun (a reply that beat its wait every time
    # for 10 s would be a wait that never spins).
    deadline = time.monotonic() + 10
    pulls = 0
    two = np.full(4, 2)
    while spinning.traffic.spins == 0 and time.monotonic() < deadline:
        np.testing.assert_array_equal(spinning.pull(t, None).ravel(), two)
        op = spinning.pull(t, None, async_op=True)
        np.testing.assert_array_equal(op.wait().ravel(), two)
        pulls += 2
    assert spinning.traffic.spins >= 1, spinning.traffic
    assert spinning.traffic.spins_caught <= spinning.traffic.spins
    for _ in range(pulls):
        np.testing.assert_array_equal(still.pull(t, None).ravel(), two)
    assert still.traffic.spins == 0, still.traffic
    assert "spins=" in repr(still.traffic)


def test_dead_server_is_unavailable(tmp_path):
    from conftest import bin_dir
    from downpour.local_cluster import LocalCluster
    with LocalCluster(bin_dir(), str(tmp_path), num_servers=2,
                      scheduler_flags=["--dead_after_ms=1000",
                                       "--heartbeat_interval_ms=200"]) as c:
        client = downpour.Client.connect(c.scheduler_address, op_timeout=5)
        t = client.create_table("t", num_keys=1000, width=1)
        client.put(t, None, np.ones(1000, np.float32))
        assert client.check_table(t) is None  # every range served
        c.kill_server(0)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.get(t, None)
            except downpour.UnavailableError as e:
                assert e.code == StatusCode.UNAVAILABLE
                assert "server" in e.message
                break
            except downpour.DeadlineExceededError:
                pass  # the map has not moved yet
            assert time.monotonic() < deadline, "no UNAVAILABLE in 20 s"
            time.sleep(0.2)
        # Without replicas no live server holds server 0's ranges: once the
        # client's map says so, check_table names the range at once.
        while True:
            try:
                client.check_table(t)
            except downpour.UnavailableError as e:
                assert e.code == StatusCode.UNAVAILABLE
                assert "'t' keys [" in e.message and "is dead" in e.message
                break
            assert time.monotonic() < deadline, "check_table kept passing"
            time.sleep(0.2)
        client.close()


def test_random_operations_match_a_model(client):
    """Random put/add/push(sum)/get sequences against a NumPy model, exact."""
    seed = int(os.environ.get("DOWNPOUR_TEST_SEED", random.randrange(2**31)))
    print(f"seed {seed} (DOWNPOUR_TEST_SEED={seed} repeats it)")
    rng = np.random.default_rng(seed)
    rows, width = 500, 3
    t = dense(client, rows=rows, width=width, handler="sum")
    model = np.zeros((rows, width), np.float32)
    for step in range(300):
        kind = rng.choice(["put", "add", "push", "get", "range"])
        n = int(rng.integers(0, 40))
        if kind == "range":
            b = int(rng.integers(0, rows))
            e = int(rng.integers(b, rows + 1))
            got = client.get(t, range(b, e))
            np.testing.assert_array_equal(got, model[b:e], f"step {step}")
            continue
        if kind == "get":  # repeats allowed when reading
            keys = rng.integers(0, rows, n).astype(np.uint64)
            got = client.get(t, keys)
            np.testing.assert_array_equal(got, model[keys.astype(np.int64)],
                                          f"step {step}")
            continue
        keys = rng.choice(rows, n, replace=False).astype(np.uint64)
        values = rng.standard_normal((n, width)).astype(np.float32)
        idx = keys.astype(np.int64)
        if kind == "put":
            client.put(t, keys, values)
            model[idx] = values
        else:
            getattr(client, kind)(t, keys, values)
            model[idx] = model[idx] + values
    np.testing.assert_array_equal(client.get(t, None), model)


def test_stub_lists_what_the_module_has():
    """The type stub (_downpour.pyi) and the extension agree on names."""
    stub = os.path.join(os.path.dirname(downpour.__file__), "_downpour.pyi")
    tree = ast.parse(open(stub).read())
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            cls = getattr(downpour._downpour, node.name)
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    assert hasattr(cls, item.name), f"{node.name}.{item.name}"
            public = {n for n in dir(cls) if not n.startswith("_")}
            stubbed = {i.name for i in node.body
                       if isinstance(i, ast.FunctionDef)}
            assert public <= stubbed, f"{node.name}: {public - stubbed}"
        elif isinstance(node, ast.FunctionDef):
            assert hasattr(downpour._downpour, node.name), node.name


def test_version_is_the_repository_version():
    from conftest import ROOT
    with open(os.path.join(ROOT, "VERSION")) as f:
        assert downpour.__version__ == f.read().strip()


def test_numpy_pin_matches_the_pybind11_in_use():
    # pybind11 < 2.12 supports NumPy 1.x only: pyproject.toml must say
    # numpy<2 then (and may drop the bound once the extension is built with
    # a pybind11 that supports NumPy 2).
    from conftest import ROOT
    with open(os.path.join(ROOT, "python", "pyproject.toml")) as f:
        text = f.read()
    pins = re.findall(r'"numpy([^"]*)"', text)
    assert pins, "pyproject.toml does not name numpy"
    if tuple(downpour._downpour._pybind11_version) < (2, 12, 0):
        assert all("<2" in p for p in pins), pins
    assert int(np.__version__.split(".")[0]) < 2 or \
        tuple(downpour._downpour._pybind11_version) >= (2, 12, 0)


def test_a_worker_joins_an_elastic_seat_and_leaves_for_good(tmp_path):
    from conftest import bin_dir
    from downpour.local_cluster import LocalCluster
    flags = ["--consistency=ssp", "--staleness=1", "--num_workers=1",
             "--elastic_workers=1"]
    with LocalCluster(bin_dir(), str(tmp_path), num_servers=1,
                      scheduler_flags=flags) as c:
        # A table, so that the server is up before the test ends (a server
        # stopped while it starts exits by the signal).
        with downpour.Client.connect(c.scheduler_address) as client:
            client.create_table("w", num_keys=4, width=1)
        a = downpour.JobMember.join(c.scheduler_address, name="a")
        assert a.rank == 0
        assert a.policy.total_workers == 1
        assert a.policy.elastic_workers == 1
        assert a.policy.max_ranks == 2
        a.report_clock(1)
        a.report_clock(2)
        a.flush()
        assert a.epoch_share(0) == (0, 1)
        b = downpour.JobMember.join(c.scheduler_address, name="b")
        assert b.rank == 1  # the seat
        assert b.epoch_share(0) is None  # it joined during epoch 0
        assert b.epoch_share(1) == (1, 2)
        assert b.start_clock == 2  # the gating clock when it joined
        with pytest.raises(ValueError):
            b.leave(finished=True, for_good=True)
        # It gates a from now on (s = 1): a may not start clock 4 ...
        a.report_clock(3)
        a.flush()
        with pytest.raises(downpour.DeadlineExceededError):
            a.wait_clock(4, timeout=0.3)
        # ... until it leaves for good: the operator asks it (psctl
        # retire), it sees it and leaves.
        assert not b.asked_to_leave
        retire = subprocess.Popen(
            [os.path.join(bin_dir(), "psctl", "psctl"), "retire", "1",
             f"--scheduler={c.scheduler_address}", "--timeout_s=60"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 60
        while not b.asked_to_leave and time.monotonic() < deadline:
            time.sleep(0.02)
        assert b.asked_to_leave
        assert not a.asked_to_leave
        b.leave(for_good=True, reason="test")
        out, _ = retire.communicate(timeout=60)
        assert retire.returncode == 0, out
        assert "rank 1: retired (worker 'b')" in out
        assert a.wait_clock(4, timeout=30) >= 3
        a.leave(finished=True)
