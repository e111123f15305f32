"""Taking GPUs for a process, waiting for them while they are busy (``run --wait``).

:func:`take_waiting` is the one entry point ``run`` and ``lease()`` call. It
tries the holding's transaction; while the GPUs are refused (held, reserved,
unhealthy) it waits for a change under the host's keys (a watch, so a
release wakes it at once; at most :data:`RECHECK_SECONDS` between tries,
which also covers a change made before the watch began) and tries again,
until the deadline. Running out of time is a ``ConflictError`` (exit 3)
naming what it waited for and why it never got it. A wait queue with a
fair order would replace the loop here and nothing else.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from allocator.errors import ConflictError, StoreError

if TYPE_CHECKING:
    from allocator.control.client import Allocator
    from allocator.control.leased import Holding
    from allocator.placement.choose import Request

__all__ = ["RECHECK_SECONDS", "take_waiting", "waited_for"]

#: The longest a waiter sleeps between two tries when it sees no change.
RECHECK_SECONDS = 1.0


def waited_for(request: Request, seconds: float, why: str) -> str:
    """The message of a wait that ran out (pure)."""
    from allocator.placement.request import describe_request
    from allocator.util.durations import format_duration

    return (
        f"waited {format_duration(seconds)} for {describe_request(request)} on "
        f"{request.host} (job {request.job}); still refused: {why}"
    )


def take_waiting(
    allocator: Allocator,
    request: Request,
    *,
    wait: float | None,
    ttl: float,
    reason: str,
    on_lost: Callable[[str], None] | None = None,
    launched_by: str = "run",
    monotonic: Callable[[], float] = time.monotonic,
) -> Holding:
    """Hold ``request``'s GPUs for this process; with ``wait`` (seconds), wait while refused."""
    from allocator.control.leased import hold

    def attempt() -> Holding:
        return hold(
            allocator, request, ttl=ttl, reason=reason, launched_by=launched_by, on_lost=on_lost
        )

    if wait is None:
        return attempt()
    deadline = monotonic() + wait
    started = monotonic()
    while True:
        try:
            return attempt()
        except ConflictError as exc:
            left = deadline - monotonic()
            if left <= 0:
                raise ConflictError(waited_for(request, monotonic() - started, str(exc))) from None
            _await_change(allocator, request.host, min(left, RECHECK_SECONDS))


def _await_change(allocator: Allocator, host: str, timeout: float) -> None:
    """Return when something under ``host``'s keys changed, or after ``timeout`` seconds."""
    if not math.isfinite(timeout) or timeout <= 0:
        return
    store = allocator.store
    try:
        revision = store.list(allocator.layout.host_generation(host)).revision
        watch = store.watch(allocator.layout.host(host), revision + 1)
    except StoreError:
        time.sleep(timeout)  # a backend that cannot watch now: the next try says why
        return
    try:
        watch.next(timeout)
    except StoreError:
        pass
    finally:
        watch.close()
