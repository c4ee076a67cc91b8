"""Downpour: a parameter server for distributed training, from Python.

Servers hold sharded tables of float vectors and apply update rules next to
the data; training processes push gradients and pull parameters::

    import numpy as np
    import downpour

    client = downpour.Client.connect("127.0.0.1:7070")
    w = client.create_table("w", num_keys=784, width=10, init="normal",
                            init_b=0.01, handler="adagrad",
                            handler_params={"learning_rate": 0.1})
    client.push(w, range(0, 784), np.ones((784, 10), np.float32))
    params = client.pull(w, range(0, 784))        # (784, 10) float32
    op = client.pull(w, [3, 1, 2], async_op=True)  # GIL released meanwhile
    rows = op.wait()

``downpour.torch`` keeps a ``torch.nn.Module``'s parameters in Downpour
tables (BSP, SSP or ASP). Errors are :mod:`downpour.errors` exceptions.
"""

from __future__ import annotations

import glob as _glob
import os as _os


def _locate_extension() -> None:
    # Installed (pip) or in Bazel's runfiles, _downpour.so sits beside this
    # file. In a source checkout it is in bazel-bin after
    # `bazel build //python:downpour`: look there too.
    here = _os.path.dirname(_os.path.abspath(__file__))
    if _glob.glob(_os.path.join(here, "_downpour*.so")):
        return
    built = _os.path.join(here, _os.pardir, _os.pardir, "bazel-bin", "python",
                          "downpour")
    if _glob.glob(_os.path.join(built, "_downpour*.so")):
        __path__.append(_os.path.normpath(built))  # noqa: F821 (package path)


_locate_extension()

from downpour import errors  # noqa: E402
from downpour._downpour import (  # noqa: E402
    Client,
    ConsistencyPolicy,
    JobMember,
    Operation,
    Table,
    TrafficStats,
    initial_rows,
    tune_allocator,
)
from downpour.errors import (  # noqa: E402
    AbortedError,
    AlreadyExistsError,
    DeadlineExceededError,
    DownpourError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    ResourceExhaustedError,
    StatusCode,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
)

connect = Client.connect

__all__ = [
    "AbortedError", "AlreadyExistsError", "Client", "ConsistencyPolicy",
    "DeadlineExceededError", "JobMember",
    "DownpourError", "FailedPreconditionError", "InternalError",
    "InvalidArgumentError", "NotFoundError", "Operation", "OutOfRangeError",
    "ResourceExhaustedError", "StatusCode", "Table", "TrafficStats",
    "UnauthenticatedError", "UnavailableError", "UnimplementedError",
    "connect", "errors", "initial_rows", "tune_allocator",
]
