"""Exceptions raised by Downpour: one class per canonical status code.

Every error the C++ SDK reports (an ``absl::Status``) arrives as an instance
of the class for its code, all subclasses of :class:`DownpourError`, which
carries ``code`` (a :class:`StatusCode`) and ``message`` (naming the table,
keys and server). Where a built-in exception means the same, the class
derives from it too, so ``except ValueError`` or ``except TimeoutError``
work as a Python programmer expects::

    try:
        client.open_table("nope")
    except downpour.NotFoundError as e:       # also a LookupError
        print(e.code, e.message)
"""

from __future__ import annotations

import enum
from typing import Dict, Type


class StatusCode(enum.IntEnum):
    """absl::StatusCode (the canonical gRPC codes)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class DownpourError(Exception):
    """A failed operation: ``code`` says what kind of failure, ``message`` the
    details."""

    code: StatusCode = StatusCode.UNKNOWN

    def __init__(self, message: str, code: StatusCode | None = None):
        if code is not None:
            self.code = StatusCode(code)
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"

    def __reduce__(self):  # picklable across processes (multiprocessing)
        return (type(self), (self.message, self.code))


class CancelledError(DownpourError):
    code = StatusCode.CANCELLED


class UnknownError(DownpourError):
    code = StatusCode.UNKNOWN


class InvalidArgumentError(DownpourError, ValueError):
    """A bad request: sizes that do not match, an unknown handler parameter."""

    code = StatusCode.INVALID_ARGUMENT


class DeadlineExceededError(DownpourError, TimeoutError):
    code = StatusCode.DEADLINE_EXCEEDED


class NotFoundError(DownpourError, LookupError):
    """An unknown table (or named vector)."""

    code = StatusCode.NOT_FOUND


class AlreadyExistsError(DownpourError):
    """A table of that name exists with a different declaration."""

    code = StatusCode.ALREADY_EXISTS


class PermissionDeniedError(DownpourError, PermissionError):
    code = StatusCode.PERMISSION_DENIED


class ResourceExhaustedError(DownpourError):
    """A message above the server's --max_message_mb."""

    code = StatusCode.RESOURCE_EXHAUSTED


class FailedPreconditionError(DownpourError):
    """The object is in the wrong state (e.g. the client is closed)."""

    code = StatusCode.FAILED_PRECONDITION


class AbortedError(DownpourError):
    code = StatusCode.ABORTED


class OutOfRangeError(DownpourError, IndexError):
    """A key outside the table's key space."""

    code = StatusCode.OUT_OF_RANGE


class UnimplementedError(DownpourError, NotImplementedError):
    code = StatusCode.UNIMPLEMENTED


class InternalError(DownpourError):
    code = StatusCode.INTERNAL


class UnavailableError(DownpourError, ConnectionError):
    """The scheduler or the owning server is down or unreachable (retry)."""

    code = StatusCode.UNAVAILABLE


class DataLossError(DownpourError):
    code = StatusCode.DATA_LOSS


class UnauthenticatedError(DownpourError, PermissionError):
    """The cluster refused this client's secret (or its lack of one)."""

    code = StatusCode.UNAUTHENTICATED


_BY_CODE: Dict[StatusCode, Type[DownpourError]] = {
    cls.code: cls
    for cls in (
        CancelledError, UnknownError, InvalidArgumentError,
        DeadlineExceededError, NotFoundError, AlreadyExistsError,
        PermissionDeniedError, ResourceExhaustedError,
        FailedPreconditionError, AbortedError, OutOfRangeError,
        UnimplementedError, InternalError, UnavailableError, DataLossError,
        UnauthenticatedError,
    )
}


def from_status(code: int, message: str) -> DownpourError:
    """The exception for a failed status (used by the extension module)."""
    try:
        status_code = StatusCode(code)
    except ValueError:
        return UnknownError(f"(status code {code}) {message}")
    return _BY_CODE.get(status_code, UnknownError)(message, status_code)
