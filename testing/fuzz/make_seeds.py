#!/usr/bin/python3
"""Writes the seed inputs of the fuzz targets that read structured values
(testing/fuzz/fuzz_input.h), so that the seeds are reviewable as code:

    /usr/bin/python3 testing/fuzz/make_seeds.py      # from the repository root

Seeds of the other targets (serialized protos, libsvm text, IDX files) are
written by hand or with protoc; see each corpus directory. Inputs that once
made a target fail are kept beside the seeds under regression-* names and
are not written here.
"""
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


class Enc:
    """The inverse of FuzzInput: what bytes make it return these values."""

    def __init__(self):
        self.b = bytearray()

    def int(self, x, lo, hi):
        span = hi - lo
        n = 0
        while n * 8 < 64 and (span >> (n * 8)) != 0:
            n += 1
        v = x - lo
        assert 0 <= v <= span, (x, lo, hi)
        self.b += v.to_bytes(n, "big") if n else b""
        return self

    def bool(self, x):
        self.b.append(1 if x else 0)
        return self

    def raw(self, fmt, x):
        self.b += struct.pack("<" + fmt, x)
        return self

    def double(self, x):
        return self.bool(True).raw("d", x)

    def edge_double(self, index):  # FuzzInput::Double's edge values
        return self.bool(False).int(index, 0, 9)

    def string(self, s, max_len):
        s = s.encode() if isinstance(s, str) else bytes(s)
        self.int(len(s), 0, max_len)
        self.b += s
        return self

    def rest(self, s):
        self.b += s
        return self


def write(target_dir, name, data):
    d = os.path.join(ROOT, target_dir)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(bytes(data))


# --- protobuf wire format, enough for DataHeader -------------------------

def varint(x):
    x &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = x & 0x7F
        x >>= 7
        if x:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(num, value):
    if isinstance(value, bytes):
        return varint(num << 3 | 2) + varint(len(value)) + value
    return varint(num << 3) + varint(value)


def header(**f):
    nums = dict(request_id=1, op=2, table_id=3, epoch=4, is_range=5,
                range_begin=6, range_end=7, num_keys=8, width=9,
                vector_id=10, worker_clock=11, sender=12, worker_rank=13)
    return b"".join(field(nums[k], int(v)) for k, v in f.items())


OPS = dict(PUT=1, GET=2, ADD=3, PUSH=4, PULL=5, PUSH_PULL=6, VECTOR=7)

# --- handler_fuzzer --------------------------------------------------------

HANDLERS = ["", "assign", "sum", "sgd", "momentum", "adagrad", "adam", "ftrl",
            "plugin:clipped_sgd", "plugin:missing", "plugin:"]
PARAMS = ["learning_rate", "momentum", "initial_accumulator", "epsilon",
          "beta1", "beta2", "alpha", "beta", "l1", "l2", "clip"]


def handler_seed(name, params, width=3, rows=2, values=(), grads=(), steps=2):
    e = Enc()
    if name in HANDLERS:
        e.int(HANDLERS.index(name), 0, len(HANDLERS))
    else:
        e.int(len(HANDLERS), 0, len(HANDLERS)).string(name, 24)
    e.int(len(params), 0, 5)
    for p, v in params:
        if p in PARAMS:
            e.int(PARAMS.index(p), 0, len(PARAMS))
        else:
            e.int(len(PARAMS), 0, len(PARAMS)).string(p, 16)
        e.double(v)
    e.int(width, 1, 9).int(rows, 1, 4)
    n = width * rows
    vals = list(values) + [0.5] * (n - len(values))
    grs = list(grads) + [-0.25] * (n - len(grads))
    for v in vals:
        e.bool(True).raw("f", v)
    for g in grs:
        e.bool(True).raw("f", g)
    e.int(steps, 1, 3)
    return e.b


def handler_seeds():
    d = "handlers/testdata/fuzz/handler_fuzzer"
    write(d, "sgd", handler_seed("sgd", [("learning_rate", 0.1)]))
    write(d, "default_sgd", handler_seed("", []))
    write(d, "momentum", handler_seed("momentum", [("learning_rate", 0.1), ("momentum", 0.5)]))
    write(d, "adagrad", handler_seed("adagrad", [("learning_rate", 0.1), ("initial_accumulator", 0.1)]))
    write(d, "adagrad_zero_eps", handler_seed("adagrad", [("epsilon", 0.0)]))
    write(d, "adam", handler_seed("adam", [("beta1", 0.9), ("beta2", 0.999), ("epsilon", 1e-8)], width=9, rows=4))
    write(d, "ftrl", handler_seed("ftrl", [("alpha", 0.1), ("beta", 1.0), ("l1", 0.01), ("l2", 0.1)]))
    write(d, "ftrl_tiny_alpha", handler_seed("ftrl", [("alpha", 1e-40)]))
    write(d, "assign", handler_seed("assign", []))
    write(d, "sum_with_param", handler_seed("sum", [("learning_rate", 1.0)]))
    write(d, "plugin", handler_seed("plugin:clipped_sgd", [("clip", 0.5), ("learning_rate", 0.2)]))
    write(d, "plugin_bad_param", handler_seed("plugin:clipped_sgd", [("clipp", 0.5)]))
    write(d, "plugin_nan", handler_seed("plugin:clipped_sgd", [("clip", float("nan"))]))
    write(d, "plugin_missing", handler_seed("plugin:missing", []))
    write(d, "unknown", handler_seed("nesterov", [("learning_rate", 0.1)]))
    write(d, "nan_rate", handler_seed("sgd", [("learning_rate", float("nan"))]))
    write(d, "huge_grads", handler_seed("adam", [], values=[3e38] * 6, grads=[-3e38] * 6))

# --- request_decoder_fuzzer --------------------------------------------------


def frames_seed(limit_index, frames, misaligned=()):
    e = Enc().int(limit_index, 0, 2).int(len(frames), 0, 4)
    for i, f in enumerate(frames):
        e.bool(i in misaligned)
        if i + 1 < len(frames):
            e.string(f, 4096)
        else:
            e.rest(f)
    return e.b


def keys(*ks):
    return b"".join(struct.pack("<Q", k) for k in ks)


def floats(*vs):
    return b"".join(struct.pack("<f", v) for v in vs)


def request_decoder_seeds():
    d = "transport/testdata/fuzz/request_decoder_fuzzer"
    h = header(request_id=7, op=OPS["PUT"], table_id=1, epoch=5, num_keys=2, width=2)
    write(d, "put", frames_seed(2, [h, keys(60, 51), floats(1, 2, 3, 4)]))
    write(d, "put_misaligned", frames_seed(2, [h, keys(60, 51), floats(1, 2, 3, 4)], misaligned=(1, 2)))
    g = header(request_id=8, op=OPS["GET"], table_id=1, epoch=5, is_range=1,
               range_begin=50, range_end=60, num_keys=10, width=2)
    write(d, "range_get", frames_seed(1, [g, b"", b""]))
    write(d, "over_limit", frames_seed(0, [h, keys(*range(8)), floats(*range(16))]))
    write(d, "ragged_keys", frames_seed(2, [h, b"\x01" * 9, floats(1)]))
    write(d, "ragged_values", frames_seed(2, [h, keys(1), b"\x01" * 5]))
    write(d, "two_frames", frames_seed(2, [h, keys(1)]))
    write(d, "four_frames", frames_seed(2, [h, keys(1), floats(1), b"x"]))
    write(d, "not_a_header", frames_seed(2, [b"\xff\xff\xff", b"", b""]))
    write(d, "empty", frames_seed(2, []))

# --- dispatcher_fuzzer -------------------------------------------------------
# Mirrors MakeRequest in server/dispatcher_fuzzer.cc.


def request(e, op, table, epoch_choice=0, width=None, vector_id=None,
            clock=None, rank=0, sender=1, rng=None, ks=(), num_keys_ok=True,
            vector=None, round_=None, values=None):
    """Appends one structured step (kind 2..9) to `e`."""
    e.int(2, 0, 9)
    e.int(OPS[op], 0, 8)
    e.int(table - 1, 0, 6)
    e.int(epoch_choice, 0, 4)
    if width is None:
        e.bool(True)
    else:
        e.bool(False).int(width, 0, 5)
    if vector_id is None:
        e.bool(True)
    else:
        e.bool(False).int(vector_id, 0, 4)
    if clock is None:
        e.bool(False)
    else:
        e.bool(True).int([-1, 0, 1, 2, 3].index(clock), 0, 4).int(rank + 1, 0, 4)
    e.int(sender, 0, 3)
    if rng is not None:
        begin, end = rng
        e.bool(True).int(0, 0, 3).int(begin, 0, 110).bool(True).int(end - begin, 0, 70)
        rows = end - begin
    else:
        e.bool(False).int(len(ks), 0, 8)
        for k in ks:
            e.int(0, 0, 3).int(k, 0, 110)
        rows = len(ks)
    if num_keys_ok:
        e.bool(True)
    else:
        e.bool(False).int(rows + 1, 0, 100)
    if op == "VECTOR":
        update, dst, a, b, alpha, beta, dots, begin, end, open_round = vector
        e.int(update, 0, 6).int(dst, 0, 4).int(a, 0, 4).int(b, 0, 4)
        e.double(alpha).double(beta).int(len(dots), 0, 3)
        for x, y in dots:
            e.int(x, 0, 4).int(y, 0, 4)
        e.bool(False)  # no unpaired dot
        e.int(0, 0, 3).int(begin, 0, 110).bool(True).int(end - begin, 0, 70)
        e.int([0, 1, 2, -1].index(open_round), 0, 3)
    if round_ is None:
        e.bool(False)
    else:
        e.bool(True).int([0, 1, 2, -1].index(round_[0]), 0, 3).int(round_[1], 0, 3)
    if values is None and op in ("GET", "PULL", "VECTOR"):
        values = []
    if values is None:  # consistent: rows x width small values
        e.bool(True)
        w = width if width is not None else {1: 2, 2: 3, 3: 1, 4: 2, 5: 1, 6: 4}[table]
        for i in range(rows * w):
            e.bool(False).int(i % 9, 0, 8)
    else:
        e.bool(False).int(len(values), 0, 64)
        for v in values:
            e.bool(True).raw("f", v)
    return e


def dispatcher_seeds():
    d = "server/testdata/fuzz/dispatcher_fuzzer"
    # Dense put / add / get / push-pull on the owned half.
    e = Enc().bool(False)
    request(e, "PUT", 1, ks=[60, 51])
    request(e, "ADD", 1, ks=[60, 60])
    request(e, "GET", 1, ks=[51, 60, 52])
    request(e, "PUSH_PULL", 1, ks=[52])
    request(e, "GET", 1, rng=(50, 100))
    write(d, "dense", e.b)
    # Sparse rows created by push, read back; a key this node does not own.
    e = Enc().bool(True)
    request(e, "PUSH", 2, ks=[7, 100])
    request(e, "PULL", 2, ks=[7, 100, 8])
    request(e, "GET", 2, rng=(0, 40))
    request(e, "PUT", 1, ks=[10])  # owned by node 1: not owner
    write(d, "sparse_and_not_owner", e.b)
    # Named vectors: open a round, task adds, algebra with dot products.
    e = Enc().bool(False)
    request(e, "VECTOR", 3, vector=(1, 1, 0, 0, 0.0, 0.0, [], 0, 64, 1))
    request(e, "ADD", 3, vector_id=1, rng=(0, 32), round_=(1, 1))
    request(e, "ADD", 3, vector_id=1, rng=(0, 32), round_=(1, 1))  # repeat
    request(e, "VECTOR", 3, vector=(4, 2, 1, 0, 0.5, 0.0, [(0, 1), (2, 2)], 0, 64, 0))
    request(e, "VECTOR", 3, vector=(5, 0, 1, 2, 1.0, -1.0, [(0, 0)], 0, 40, 0))
    write(d, "vectors", e.b)
    # BSP: two workers push clock 0 with PushPull on a range; a late push.
    e = Enc().bool(False)
    request(e, "PUSH_PULL", 4, clock=0, rank=0, rng=(0, 16))
    request(e, "PUSH_PULL", 4, clock=0, rank=1, rng=(0, 16))
    request(e, "PUSH", 4, clock=0, rank=2, rng=(0, 16))
    request(e, "PULL", 4, clock=1, rank=0, rng=(0, 16))
    request(e, "PUSH", 5, clock=0, rank=0, ks=[3, 9])
    request(e, "PUSH", 5, clock=0, rank=1, ks=[3])
    write(d, "bsp", e.b)
    # Plugin table; wrong widths, epochs and value counts.
    e = Enc().bool(True)
    request(e, "PUSH", 6, rng=(0, 8))
    request(e, "PUSH", 6, width=3, rng=(0, 8))
    request(e, "GET", 1, epoch_choice=2, ks=[55])
    request(e, "PUT", 1, ks=[55], values=[1.0])
    request(e, "GET", 1, ks=[55], num_keys_ok=False)
    write(d, "bad_requests", e.b)
    # A new map moves a range; requests before and after.
    e = Enc().bool(False)
    request(e, "PUT", 1, ks=[70])
    e.int(0, 0, 9)  # NextMap
    e.int(0, 0, 4).int(1, 0, 3)  # epoch + 1, one edit
    e.int(0, 0, 5).int(0, 0, 4).int(1, 0, 1)  # table 1: flip range 1's owner
    request(e, "GET", 1, epoch_choice=2, ks=[70])
    write(d, "new_map", e.b)


if __name__ == "__main__":
    handler_seeds()
    request_decoder_seeds()
    dispatcher_seeds()
