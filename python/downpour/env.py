"""The environment contract: how a training process learns where its
cluster is and who it is, the way torchrun's ``env://`` does.

``downpour.JobMember.join()`` and ``downpour.Client.connect()`` read these
variables for every argument the caller omits (an argument given wins)::

    DOWNPOUR_SCHEDULER             host:port of ps_scheduler (required when
                                   no scheduler_address is passed)
    DOWNPOUR_NAME                  the member's name (join; default: none,
                                   a fresh identity)
    DOWNPOUR_RANK                  the rank to take (join; e.g. a Kubernetes
                                   Indexed Job's JOB_COMPLETION_INDEX)
    DOWNPOUR_JOB_TOKEN_FILE        the job token (ps_scheduler
                                   --job_token_file), join
    DOWNPOUR_CLUSTER_SECRET_FILE   the cluster secret (ps_keygen)
    DOWNPOUR_TLS_CA_FILE, DOWNPOUR_TLS_CERT_FILE, DOWNPOUR_TLS_KEY_FILE,
    DOWNPOUR_TLS_MUTUAL (1 or 0), DOWNPOUR_TLS_SERVER_NAME
                                   TLS on gRPC, as the daemons' --tls_* flags

``python3 -m downpour.run`` sets them for the workers it starts, and the
Kubernetes component ``deploy/k8s/components/pytorch-workers`` for its
pods. Only these two entry points read the environment; nothing deeper in
the SDK does.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional

SCHEDULER = "DOWNPOUR_SCHEDULER"
NAME = "DOWNPOUR_NAME"
RANK = "DOWNPOUR_RANK"
JOB_TOKEN_FILE = "DOWNPOUR_JOB_TOKEN_FILE"
CLUSTER_SECRET_FILE = "DOWNPOUR_CLUSTER_SECRET_FILE"
TLS_CA_FILE = "DOWNPOUR_TLS_CA_FILE"
TLS_CERT_FILE = "DOWNPOUR_TLS_CERT_FILE"
TLS_KEY_FILE = "DOWNPOUR_TLS_KEY_FILE"
TLS_MUTUAL = "DOWNPOUR_TLS_MUTUAL"
TLS_SERVER_NAME = "DOWNPOUR_TLS_SERVER_NAME"

# Keyword argument -> variable, for the arguments both entry points share.
_AUTH = {
    "cluster_secret_file": CLUSTER_SECRET_FILE,
    "tls_ca_file": TLS_CA_FILE,
    "tls_cert_file": TLS_CERT_FILE,
    "tls_key_file": TLS_KEY_FILE,
    "tls_server_name": TLS_SERVER_NAME,
}


def _get(environ: Mapping[str, str], name: str) -> Optional[str]:
    value = environ.get(name, "")
    return value if value != "" else None


def _flag(environ: Mapping[str, str], name: str) -> bool:
    value = environ.get(name, "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise ValueError(f"{name}={environ[name]!r}: 1 or 0")


def scheduler_address(given: Optional[str],
                      environ: Mapping[str, str] = os.environ) -> str:
    """``given``, else $DOWNPOUR_SCHEDULER; ValueError naming both if
    neither is set."""
    if given:
        return given
    address = _get(environ, SCHEDULER)
    if address is None:
        raise ValueError(f"no scheduler address: pass one or set {SCHEDULER} "
                         "(python3 -m downpour.run sets it)")
    return address


def auth_kwargs(given: Dict[str, Any],
                environ: Mapping[str, str] = os.environ) -> Dict[str, Any]:
    """The secret and TLS arguments: those in ``given`` that are not None,
    the environment's for the others."""
    out: Dict[str, Any] = {}
    for arg, var in _AUTH.items():
        value = given.get(arg)
        out[arg] = value if value is not None else _get(environ, var)
    mutual = given.get("tls_mutual")
    out["tls_mutual"] = (bool(mutual) if mutual is not None
                         else _flag(environ, TLS_MUTUAL))
    return out


def member_kwargs(given: Dict[str, Any],
                  environ: Mapping[str, str] = os.environ) -> Dict[str, Any]:
    """join()'s identity arguments (name, rank, job token file) and the
    auth ones, filled from the environment where ``given`` has None."""
    out = auth_kwargs(given, environ)
    name = given.get("name")
    out["name"] = name if name is not None else (_get(environ, NAME) or "")
    rank = given.get("rank")
    if rank is None:
        text = _get(environ, RANK)
        try:
            rank = int(text) if text is not None else -1
        except ValueError:
            raise ValueError(f"{RANK}={text!r} is not a rank") from None
    out["rank"] = rank
    if given.get("job_token") is not None:
        out["job_token"] = given["job_token"]
        out["job_token_file"] = given.get("job_token_file")
    else:
        token_file = given.get("job_token_file")
        out["job_token_file"] = (token_file if token_file is not None
                                 else _get(environ, JOB_TOKEN_FILE))
    return out
