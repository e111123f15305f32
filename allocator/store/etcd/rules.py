"""What an etcd answer means: the decisions the etcd client makes on etcd's answers.

etcd's JSON gateway (:mod:`allocator.store.etcd.store`) answers with a gRPC
status code and a message, as etcd's own clients see them. How an answer
is reported, whether a write that failed may still have been applied,
whether another endpoint is worth a try and when a login is stale are
decided here, apart from the I/O, so each decision is tested on its own.

Pure: no I/O, no client library.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum

from allocator.errors import (
    AllocatorError,
    AmbiguousWrite,
    CasConflict,
    Compacted,
    LeaseLost,
    PermissionDenied,
    StoreConfigError,
    StoreError,
    StoreUnavailable,
    ValueTooLarge,
)
from allocator.store.base import Compare

__all__ = [
    "MAX_TXN_OPS",
    "Code",
    "EtcdStatus",
    "ambiguous_write",
    "attempt_timeout",
    "conflict",
    "electing",
    "maybe_applied",
    "prefix_range_end",
    "token_is_stale",
    "translate_status",
    "watch_error",
    "worth_another_endpoint",
]

#: etcd's default ``--max-txn-ops``: compares (and writes) one transaction may hold.
MAX_TXN_OPS = 128


class Code(IntEnum):
    """gRPC status codes (the gateway reports the same numbers in its JSON errors)."""

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


class EtcdStatus(Exception):
    """An error answer from etcd: a gRPC status ``code`` and etcd's ``details``."""

    def __init__(self, code: int, details: str) -> None:
        self.code = code
        self.details = details
        super().__init__(f"{_code_name(code)}: {details}")


_UNAVAILABLE_CODES = frozenset(
    {Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED, Code.RESOURCE_EXHAUSTED, Code.CANCELLED}
)
# Codes etcd never answers to what allocator sends: something else listens there.
_NOT_ETCD_CODES = frozenset({Code.UNIMPLEMENTED, Code.INTERNAL, Code.UNKNOWN})


def _code_name(code: int) -> str:
    try:
        return Code(code).name
    except ValueError:
        return f"code {code}"


def attempt_timeout(remaining: float, endpoints_left: int) -> float:
    """Seconds one endpoint may take: an equal share of what is left of the call's budget.

    The shares of every endpoint still to try add up to ``remaining``, so a
    call that fails over across all of them still ends within its budget.
    """
    return max(remaining, 0.0) / max(endpoints_left, 1)


def token_is_stale(text: str) -> bool:
    """Whether etcd refused a call because its auth token must be renewed.

    Simple tokens expire after 5 idle minutes (or when auth is switched off
    and on); a JWT from before any change to users or roles is "old".
    """
    return "invalid auth token" in text or "auth store is old" in text


def maybe_applied(code: int, details: str) -> bool:
    """Whether a write sent to etcd that got this answer may still have committed.

    "No leader" and "failed to connect" mean etcd never took it; a timeout
    or another unavailability may have come after the commit.
    """
    if code == Code.UNAVAILABLE:
        return "failed to connect" not in details and "no leader" not in details
    return code in (Code.DEADLINE_EXCEEDED, Code.CANCELLED)


def electing(code: int, details: str) -> bool:
    """Whether etcd's answer says its members are choosing a leader (asked again soon, it answers).

    "no leader" comes while there is none; "leader changed" cancels a read
    that was waiting on the old one. etcd's own client retries both.
    """
    return code == Code.UNAVAILABLE and ("no leader" in details or "leader changed" in details)


def worth_another_endpoint(code: int, details: str, idempotent: bool) -> bool:
    """Whether a call that got this answer should be tried on the next endpoint.

    A write that may have been applied must not be applied twice, so only
    calls that are ``idempotent`` (or were certainly not applied) move on.
    """
    if idempotent and code == Code.DEADLINE_EXCEEDED:
        return True  # a silent endpoint used up its share of the budget
    if code != Code.UNAVAILABLE:
        return False
    return idempotent or "failed to connect" in details or "no leader" in details


def translate_status(code: int, details: str, where: str) -> AllocatorError:
    """Map an etcd answer onto allocator's error tree; ``where`` names the endpoint(s)."""
    details = details or _code_name(code)
    if code in _UNAVAILABLE_CODES:
        return StoreUnavailable(f"etcd at {where} is unavailable: {details}")
    if "user name is empty" in details:
        return PermissionDenied(
            f"etcd at {where} requires a user: set ETCDCTL_USER or give user:password@ in the URL"
        )
    if "authentication is not enabled" in details:
        return StoreConfigError(f"etcd at {where}: a user was given but {details}")
    denied = (Code.PERMISSION_DENIED, Code.UNAUTHENTICATED)
    if code in denied or "authentication failed" in details:
        return PermissionDenied(f"etcd at {where}: {details}")
    if "lease not found" in details:
        return LeaseLost(f"etcd at {where}: {details}")
    if "request is too large" in details:
        return ValueTooLarge(f"etcd at {where}: {details}")
    if code in _NOT_ETCD_CODES:
        return StoreUnavailable(f"etcd at {where}: {details[:200]} (is it an etcd v3 server?)")
    return StoreError(f"etcd at {where}: {details}")


def ambiguous_write(where: str, timeout: float) -> AmbiguousWrite:
    """The error for a write that was sent but not confirmed within the call's budget."""
    return AmbiguousWrite(
        f"etcd at {where} did not confirm the write within {timeout:g} s: "
        "it may have been applied; re-run to check"
    )


def conflict(compares: Sequence[Compare], found: Sequence[int]) -> CasConflict:
    """The ``CasConflict`` for a failed transaction.

    ``found`` holds each compared key's mod_revision (0: absent) as the
    transaction's failure branch read it, at the very revision the compare
    failed at; the error names exactly the keys that changed.
    """
    failed: list[str] = []
    details: list[str] = []
    for compare, revision in zip(compares, found, strict=True):
        if revision != compare.mod_revision:
            failed.append(compare.key)
            want = compare.mod_revision or "absent"
            details.append(f"{compare.key} (expected {want}, found {revision or 'absent'})")
    return CasConflict(f"changed since read: {', '.join(details)}", keys=tuple(failed))


def watch_error(
    compact_revision: int, canceled: bool, cancel_reason: str, where: str
) -> AllocatorError | None:
    """The error a watch response carries, if any (``None``: a normal response)."""
    if compact_revision:
        return Compacted(
            f"etcd at {where}: history before revision {compact_revision} is compacted",
            compact_revision=compact_revision,
        )
    if canceled:
        reason = cancel_reason or "watch cancelled by the server"
        refused = any(word in reason for word in ("permission denied", "auth", "Unauthenticated"))
        kind = PermissionDenied if refused else StoreUnavailable
        return kind(f"etcd at {where}: {reason}")
    return None


def prefix_range_end(prefix: bytes) -> bytes:
    """The ``range_end`` that makes an etcd range cover every key starting with ``prefix``.

    etcd's rule: the prefix with its last byte below 0xff incremented (and
    what follows dropped); ``b"\\0"`` (every key) if all its bytes are 0xff.
    """
    for index in range(len(prefix) - 1, -1, -1):
        if prefix[index] < 0xFF:
            return prefix[:index] + bytes([prefix[index] + 1])
    return b"\0"
