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

Called without a scheduler address (and other omitted arguments),
``Client.connect()`` and ``JobMember.join()`` read the environment contract
of :mod:`downpour.env` (``DOWNPOUR_SCHEDULER``, ``DOWNPOUR_RANK``, ...),
which ``python3 -m downpour.run`` (:mod:`downpour.run`) sets for the
workers it starts, as torchrun does.
"""

from __future__ import annotations

import glob as _glob
import os as _os
from typing import Optional


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


def _check_numpy() -> None:
    # NumPy 2 changed the C ABI that pybind11 reaches through its numpy
    # support; pybind11 learned it in 2.12. pyproject.toml pins NumPy below
    # 2 for the pybind11 of Debian 12 (2.10); this says so at import rather
    # than failing at the first array.
    import numpy
    from downpour._downpour import _pybind11_version
    major = int(numpy.__version__.split(".")[0])
    if major >= 2 and tuple(_pybind11_version) < (2, 12, 0):
        raise ImportError(
            f"downpour was built with pybind11 "
            f"{'.'.join(map(str, _pybind11_version))}, which supports NumPy "
            f"1.x only; this is NumPy {numpy.__version__}: install numpy<2")


_check_numpy()

from downpour import env as _env  # noqa: E402
from downpour import errors  # noqa: E402
from downpour._downpour import (  # noqa: E402
    __version__,
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
    PermissionDeniedError,
    ResourceExhaustedError,
    StatusCode,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
)



def _connect(scheduler_address: Optional[str] = None, *,
             op_timeout: float = 30.0, connect_timeout: float = 30.0,
             max_message_bytes: int = 64 << 20,
             cluster_secret_file: Optional[str] = None,
             tls_ca_file: Optional[str] = None,
             tls_cert_file: Optional[str] = None,
             tls_key_file: Optional[str] = None,
             tls_mutual: Optional[bool] = None,
             tls_server_name: Optional[str] = None,
             spin_wait: float = 200e-6) -> Client:
    """Connects to the scheduler at host:port and fetches the cluster map.

    Every argument left out (None) comes from the environment
    (:mod:`downpour.env`): the address from ``DOWNPOUR_SCHEDULER``, the
    secret from ``DOWNPOUR_CLUSTER_SECRET_FILE``, TLS from
    ``DOWNPOUR_TLS_*``. op_timeout: seconds per operation, retries
    included; max_message_bytes: larger parts are cut;
    cluster_secret_file: the cluster's secret when it has one; tls_*: the
    CA, this program's certificate and key (under mutual TLS), as the
    daemons' --tls_* flags; spin_wait: the C++ SDK's
    ClientOptions::spin_wait, in seconds (0 to 0.01): how long the wait
    for the client's only operation in flight spins (GIL released) before
    it sleeps; 0: never (many processes sharing few cores). The client's
    ``traffic`` counts the waits that spun. Raises
    ValueError without an address or with a spin_wait out of range,
    UnavailableError if the scheduler cannot be reached within
    connect_timeout seconds, UnauthenticatedError if it refuses the
    secret, InvalidArgumentError for half a TLS set-up, NotFoundError for
    a file that cannot be read.
    """
    auth = _env.auth_kwargs(dict(
        cluster_secret_file=cluster_secret_file, tls_ca_file=tls_ca_file,
        tls_cert_file=tls_cert_file, tls_key_file=tls_key_file,
        tls_mutual=tls_mutual, tls_server_name=tls_server_name))
    return Client._connect(_env.scheduler_address(scheduler_address),
                           op_timeout=op_timeout,
                           connect_timeout=connect_timeout,
                           max_message_bytes=max_message_bytes,
                           spin_wait=spin_wait, **auth)


def _join(scheduler_address: Optional[str] = None, *,
          name: Optional[str] = None, rank: Optional[int] = None,
          job_token: Optional[str] = None,
          job_token_file: Optional[str] = None,
          register_timeout: float = 30.0, rpc_timeout: float = 10.0,
          cluster_secret_file: Optional[str] = None,
          tls_ca_file: Optional[str] = None,
          tls_cert_file: Optional[str] = None,
          tls_key_file: Optional[str] = None,
          tls_mutual: Optional[bool] = None,
          tls_server_name: Optional[str] = None) -> JobMember:
    """Registers with the scheduler as a worker and starts heartbeating.

    Every argument left out (None) comes from the environment
    (:mod:`downpour.env`): ``DOWNPOUR_SCHEDULER``, ``DOWNPOUR_NAME``,
    ``DOWNPOUR_RANK``, ``DOWNPOUR_JOB_TOKEN_FILE``,
    ``DOWNPOUR_CLUSTER_SECRET_FILE``, ``DOWNPOUR_TLS_*``.

    name: a stable identity (joining again under the name of a dead member
    gets its rank back); empty: a fresh one. rank: the rank to take (a
    Kubernetes Indexed Job's completion index), so that a replacement takes
    its predecessor's rank; -1: the scheduler picks. job_token or
    job_token_file: the job token when the scheduler has one. The secret
    and TLS files as for Client.connect.

    A member that replaces a lost worker, or joins a job restored from a
    checkpoint, says so: ``start_clock`` (where to go on from),
    ``restored_from`` and ``barrier_passed(name)``;
    ``downpour.torch.DistributedModel`` uses them to resume instead of
    initializing again.

    Raises ValueError without an address, UnavailableError /
    DeadlineExceededError (no scheduler within register_timeout),
    AlreadyExistsError (a live worker has this name or rank: a
    replacement retries until the old one is declared dead),
    ResourceExhaustedError (the job has all its workers),
    PermissionDeniedError (no or a wrong job token),
    UnauthenticatedError. The GIL is released meanwhile.
    """
    kwargs = _env.member_kwargs(dict(
        name=name, rank=rank, job_token=job_token,
        job_token_file=job_token_file,
        cluster_secret_file=cluster_secret_file, tls_ca_file=tls_ca_file,
        tls_cert_file=tls_cert_file, tls_key_file=tls_key_file,
        tls_mutual=tls_mutual, tls_server_name=tls_server_name))
    return JobMember._join(_env.scheduler_address(scheduler_address),
                           register_timeout=register_timeout,
                           rpc_timeout=rpc_timeout, **kwargs)


Client.connect = staticmethod(_connect)
JobMember.join = staticmethod(_join)
connect = Client.connect

__all__ = [
    "AbortedError", "AlreadyExistsError", "Client", "ConsistencyPolicy",
    "DeadlineExceededError", "JobMember",
    "DownpourError", "FailedPreconditionError", "InternalError",
    "InvalidArgumentError", "NotFoundError", "Operation", "OutOfRangeError",
    "PermissionDeniedError",
    "ResourceExhaustedError", "StatusCode", "Table", "TrafficStats",
    "UnauthenticatedError", "UnavailableError", "UnimplementedError",
    "__version__", "connect", "errors", "initial_rows", "tune_allocator",
]
