"""The one exception tree of allocator.

Two families matter to callers:

* :class:`Retryable` errors (store unavailable, lease lost, a lost
  compare-and-swap) may go away if the same thing is tried again;
* every other :class:`AllocatorError` is something a person must fix
  (bad policy, bad request, an allocation conflict, a permission).

Each class carries the process exit code the CLI uses for it, so the
mapping lives in exactly one place.
"""

from __future__ import annotations

__all__ = [
    "EXIT_CONFLICT",
    "EXIT_INTERNAL",
    "EXIT_INVALID",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_PERMISSION",
    "EXIT_UNAVAILABLE",
    "AllocatorError",
    "AmbiguousWrite",
    "BadRecord",
    "CasConflict",
    "Compacted",
    "ConflictError",
    "InvalidInput",
    "InvalidName",
    "LeaseLost",
    "NotFound",
    "NotPermitted",
    "PermissionDenied",
    "PlacementRefused",
    "PolicyError",
    "RequestError",
    "Retryable",
    "StoreConfigError",
    "StoreError",
    "StoreUnavailable",
    "ValueTooLarge",
    "placed_fields",
    "placed_text",
]

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_INVALID = 2
EXIT_CONFLICT = 3
EXIT_UNAVAILABLE = 4
EXIT_PERMISSION = 5
EXIT_NOT_FOUND = 6


class AllocatorError(Exception):
    """Base of every error allocator raises on purpose."""

    exit_code: int = EXIT_INTERNAL


class Retryable(AllocatorError):
    """Marker: trying the same operation again may succeed."""


# --- errors the user must fix (exit 2) ---------------------------------------


class InvalidInput(AllocatorError):
    """Something the user typed or wrote is wrong."""

    exit_code = EXIT_INVALID


class InvalidName(InvalidInput):
    """A host, job or key component is not an allowed name."""


class RequestError(InvalidInput):
    """A request (set/release/...) is malformed or impossible as asked."""


class PolicyError(InvalidInput):
    """A policy file is invalid; the message names file, line and field.

    A policy with several problems raises one ``PolicyError`` whose message
    is the first problem (plus "(and N more)"); ``errors`` holds every
    problem as its own ``PolicyError`` (just ``(self,)`` for a single one).
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        field: str | None = None,
        errors: tuple[PolicyError, ...] = (),
    ) -> None:
        self.file = file
        self.line = line
        self.field = field
        self.reason = message
        self.errors: tuple[PolicyError, ...] = errors or (self,)
        super().__init__(self._render())

    def to_dict(self) -> dict[str, str | int | None]:
        """Return this one problem as JSON-ready data (for ``-o json``)."""
        fields = placed_fields(self.file, self.line, self.field, self.reason)
        return {**fields, "error": self._render()}

    def _render(self) -> str:
        return placed_text(self.file or "<policy>", self.line, self.field, self.reason)


def placed_text(file: str, line: int | None, field: str | None, reason: str) -> str:
    """A policy problem (error or warning) as printed: ``file:line: field: reason``."""
    where = file if line is None else f"{file}:{line}"
    return f"{where}: {field}: {reason}" if field else f"{where}: {reason}"


def placed_fields(
    file: str | None, line: int | None, field: str | None, reason: str
) -> dict[str, str | int | None]:
    """A policy problem's place and reason as ``-o json`` writes them."""
    return {"file": file, "line": line, "field": field, "message": reason}


class StoreConfigError(InvalidInput):
    """The store URL, credentials file or TLS material is unusable."""


# --- conflicts (exit 3) --------------------------------------------------------


class ConflictError(AllocatorError):
    """The request is well-formed but collides with the current state."""

    exit_code = EXIT_CONFLICT


class PlacementRefused(ConflictError):
    """A GPU is held by another job or reserved for others."""


# --- not found (exit 6) ---------------------------------------------------------


class NotFound(AllocatorError):
    """The job or host asked about holds nothing (a script can tell this from a refusal)."""

    exit_code = EXIT_NOT_FOUND


# --- not permitted (exit 5) -----------------------------------------------------


class NotPermitted(AllocatorError):
    """Allocator's own rules refuse this user the change (another holder's assignment)."""

    exit_code = EXIT_PERMISSION


# --- store errors --------------------------------------------------------------


class StoreError(AllocatorError):
    """Base of errors coming from a store backend."""


class StoreUnavailable(StoreError, Retryable):
    """The store cannot be reached (or did not answer in time)."""

    exit_code = EXIT_UNAVAILABLE


class AmbiguousWrite(StoreUnavailable):
    """A write was sent but its answer never came: it may or may not have been applied.

    Exit 4 like any unreachable store; the message says to re-run (or read
    back) to find out, because retrying blindly could apply it twice.
    """


class PermissionDenied(StoreError):
    """The store refused the credentials or the key range."""

    exit_code = EXIT_PERMISSION


class CasConflict(StoreError, Retryable):
    """A conditional write lost: a compared key changed since it was read."""

    exit_code = EXIT_CONFLICT

    def __init__(self, message: str, *, keys: tuple[str, ...] = ()) -> None:
        self.keys = keys
        super().__init__(message)


class LeaseLost(StoreError, Retryable):
    """A lease expired or was revoked before it could be refreshed."""

    exit_code = EXIT_UNAVAILABLE


class Compacted(StoreError):
    """A watch asked for history the store no longer keeps; re-read instead."""

    def __init__(self, message: str, *, compact_revision: int) -> None:
        self.compact_revision = compact_revision
        super().__init__(message)


class ValueTooLarge(StoreError):
    """A value exceeds the backend's size limit."""

    exit_code = EXIT_INVALID


class BadRecord(StoreError):
    """A stored record is malformed: wrong JSON, wrong types, or a body that disagrees with its key.

    Readers skip such a record and report it (``key`` says where it is);
    it is never a reason to crash or to stop a worker.
    """

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"bad record at {key}: {reason}" if key else f"bad record: {reason}")
