"""Taking GPUs for a process, waiting for them while they are busy (``run``, ``lease(wait=)``).

:func:`take_waiting` is the one entry point ``run`` and ``lease()`` call. It
tries the holding's transaction; while the GPUs are refused (held, reserved,
unhealthy, over a quota) it waits in the host's fair queue
(:func:`allocator.recipes.queue.wait.wait_in_queue`: a leased entry, a watch,
its turn taken in the holding's own transaction) until the deadline. Running
out of time is a ``ConflictError`` (exit 3) naming what it waited for and
why it never got it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from allocator.errors import ConflictError
from allocator.recipes.holding import hold, let_go
from allocator.records.codec import replace_struct

if TYPE_CHECKING:
    from allocator.control.gate import Gate
    from allocator.placement.choose import Request
    from allocator.recipes.context import Context
    from allocator.recipes.holding import Holding
    from allocator.records.types import LaunchedBy

__all__ = ["take_waiting", "waited_for"]


def waited_for(request: Request, seconds: float, why: str) -> str:
    """The message of a wait that ran out (pure)."""
    from allocator.placement.request import describe_request
    from allocator.util.durations import format_duration

    return (
        f"waited {format_duration(seconds)} for {describe_request(request)} on "
        f"{request.host} (job {request.job}); still refused: {why}"
    )


def take_waiting(
    allocator: Context,
    request: Request,
    *,
    wait: float | None,
    ttl: float,
    reason: str,
    on_lost: Callable[[str], None] | None = None,
    launched_by: LaunchedBy = "run",
    tell: Callable[[str], None] = lambda _line: None,
    on_wait: Callable[[str], None] = lambda _why: None,
    monotonic: Callable[[], float] = time.monotonic,
    on_preempted: Callable[[str], None] | None = None,
) -> Holding:
    """Hold ``request``'s GPUs for this process; with ``wait`` (seconds), wait while refused.

    Without ``wait`` (``None`` or 0) it is refused at once, naming what is
    ahead: the holder, or a waiting request that could use the GPUs (no one
    passes the queue).

    ``on_wait`` hears why it waits in the queue: once on joining it, then
    each time the reason changes; ``on_preempted`` the job a ``--preemptible``
    holding's GPUs went to (:func:`~allocator.recipes.holding.hold`).

    The holding is returned only once no other job's worker still runs on its
    GPUs (``tell`` says what it waits for), within what is left of ``wait``
    (without one, :data:`~allocator.recipes.gpu_free.DEFAULT_BOUND`); past
    that the holding is let go and it is a ``ConflictError``.
    """
    started = monotonic()
    hooks = (on_lost, on_preempted)
    holding = _take(allocator, request, wait, ttl, reason, hooks, launched_by, on_wait, monotonic)
    from allocator.recipes.gpu_free import DEFAULT_BOUND, wait_until_free

    bound = DEFAULT_BOUND if wait is None else max(wait - (monotonic() - started), 0.0)
    try:
        wait_until_free(allocator, holding.assignment, bound=bound, tell=tell, monotonic=monotonic)
    except BaseException:
        let_go(allocator, holding, 1, "the GPUs' previous workers did not stop in time")
        raise
    return holding


def _take(
    allocator: Context,
    request: Request,
    wait: float | None,
    ttl: float,
    reason: str,
    hooks: tuple[Callable[[str], None] | None, Callable[[str], None] | None],
    launched_by: LaunchedBy,
    on_wait: Callable[[str], None],
    monotonic: Callable[[], float],
) -> Holding:
    from allocator.recipes.queue.wait import WaitTimedOut, queue_gate, wait_in_queue

    # Its asker picks its job name: reservations and priorities look at who asks.
    request = replace_struct(request, self_service=True)

    def take(gate: Gate) -> Holding:
        return hold(
            allocator,
            request,
            ttl=ttl,
            reason=reason,
            launched_by=launched_by,
            on_lost=hooks[0],
            gate=gate,
            on_preempted=hooks[1],
        )

    if not wait:  # refused while a waiting request could use the GPUs: no one passes the queue
        return take(queue_gate(allocator, request))
    started = monotonic()
    timeout = wait if math.isfinite(wait) else None
    try:
        return wait_in_queue(
            allocator, request, take, timeout=timeout, on_wait=on_wait, clock=monotonic
        )
    except WaitTimedOut as exc:
        raise ConflictError(waited_for(request, monotonic() - started, exc.why)) from None
