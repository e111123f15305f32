"""What a failure in the agent's store link means, and what the link does about it (pure).

* a lease that expired under a write: grant a new one; no outage;
* a refused request (:data:`REFUSALS`) while connected: the store answered,
  so the link stays, and the next tick goes on;
* anything else ends the connection, and the link reconnects: at once with
  backoff for an outage (:class:`~allocator.errors.Retryable`), slowly (at
  the cap) for a refused permission, with backoff for a setting the store
  refused, and with its traceback for a bug of ours.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any, Literal

from allocator.errors import (
    AllocatorError,
    ConflictError,
    InvalidInput,
    LeaseLost,
    NotFound,
    PermissionDenied,
    Retryable,
    ValueTooLarge,
)

__all__ = ["REFUSALS", "Verdict", "judge"]

#: Errors that refuse one request while the store itself works: never an outage.
REFUSALS: tuple[type[AllocatorError], ...] = (InvalidInput, ConflictError, NotFound, ValueTooLarge)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do: ``keep`` the link (``lease`` lost, or a ``refused`` request) or ``drop`` it.

    A dropped link reconnects ``slowly`` (at the backoff's cap) or with
    backoff; ``event`` and ``fields`` are what to log, ``text`` the one line.
    """

    action: Literal["lease", "refused", "drop"]
    event: str
    text: str
    fields: dict[str, Any] = field(default_factory=dict)
    slowly: bool = False


def judge(error: Exception, *, connected: bool, has_store: bool) -> Verdict:
    """The verdict on ``error`` from a link ``connected`` (its first read done) or not."""
    text = " ".join(str(error).split()) or type(error).__name__
    named = f"{type(error).__name__}: {text}"
    if isinstance(error, LeaseLost) and has_store:
        return Verdict("lease", "lease-lost", text, {"error": str(error)})
    if isinstance(error, REFUSALS) and not isinstance(error, Retryable) and connected:
        return Verdict("refused", "request-refused", text, {"error": named})
    if isinstance(error, Retryable):
        return Verdict("drop", "store-unavailable", text, {"error": text, "stale": True})
    if isinstance(error, PermissionDenied):
        return Verdict("drop", "store-permission-denied", text, {"error": text}, slowly=True)
    if isinstance(error, AllocatorError):  # a setting or the store refusing a request
        return Verdict("drop", "store-error", text, {"error": named})
    trace = "".join(traceback.format_exception(error)).strip()
    return Verdict("drop", "link-error", text, {"error": named, "traceback": trace})
