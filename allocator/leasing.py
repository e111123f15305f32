"""``allocator.lease()``: GPUs for this Python process (a notebook, a script).

::

    import allocator

    with allocator.lease(count=1) as grant:
        model.to(grant.device())

The GPUs are taken exactly as ``allocator run`` takes them (the same
transaction as a ``set``, bound to a store lease kept alive by a daemon
thread), and this process's environment gets what the agent gives a worker
(``CUDA_VISIBLE_DEVICES`` and the rest) for the block; leaving the block
releases them, and so does the interpreter's death (the lease expires).

Losing the hold (an operator's ``release``, the store unreachable for the
whole TTL, a process paused past it) is never silent: ``LeaseLost`` is
raised in the thread that entered the block, at its next Python
instruction (a call blocked in C, a long ``time.sleep``, raises when it
returns), or, with ``on_lost=``, that callback is called instead (from the
lease's thread) and the block decides. Whatever the block started carries
the holding's identity (``ALLOCATOR_HOLDING``), so the host's agent stops
it once the hold is gone.
CUDA reads ``CUDA_VISIBLE_DEVICES`` once, when it initialises: a process
that already initialised CUDA is refused, since it would keep seeing the
devices it saw then.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from allocator.errors import LeaseLost, RequestError

__all__ = ["Grant", "cuda_initialised", "lease", "wait_seconds"]


@dataclass(frozen=True)
class Grant:
    """What a lease holds: the job, host and GPUs (host indices), and the environment set."""

    job: str
    host: str
    gpus: tuple[int, ...]
    env: dict[str, str] = field(default_factory=dict)

    def device(self, index: int = 0) -> Any:
        """The torch device of the ``index``-th GPU held (``cpu`` when none is)."""
        import torch

        if not self.gpus:
            return torch.device("cpu")
        if not 0 <= index < len(self.gpus):
            raise IndexError(f"this lease holds {len(self.gpus)} GPU(s), not index {index}")
        return torch.device("cuda", index)  # CUDA numbers the visible devices from 0


def cuda_initialised() -> bool:
    """Whether this process has initialised CUDA through torch (torch is never imported here)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    is_initialized = getattr(cuda, "is_initialized", None)
    return bool(is_initialized()) if callable(is_initialized) else False


@contextmanager
def lease(
    count: int | None = 1,
    gpus: Sequence[int] | None = None,
    host: str | None = None,
    job: str | None = None,
    ttl: float = 15.0,
    *,
    wait: str | float | None = 0,
    store: str | None = None,
    prefix: str | None = None,
    on_lost: Callable[[str], None] | None = None,
    time: str | None = None,
) -> Iterator[Grant]:
    """Hold ``count`` GPUs (or exactly ``gpus``) on this machine for the block.

    ``time``: a time limit (``"2h"``, as ``run time=``; default: the pool's
    ``default_time``, if any): when it comes the GPUs are released (history:
    ``time limit``) and the block hears of it as of a lost hold.

    ``host``: this machine's name in the policy (default: ``$ALLOCATOR_HOST``,
    else the host name); another host's is ``InvalidInput``.

    ``wait``: how long to wait while they are busy (``ConflictError`` then;
    why it waits is logged at INFO on the ``allocator.leasing`` logger, once
    on joining the queue and each time that changes):
    a duration as the CLI's ``--wait`` takes it (``"30m"``, ``"1h30m"``,
    ``"forever"``), seconds as a number, ``None`` for forever; 0 (the
    default) does not wait. A bad value raises ``ValueError``;
    ``store``/``prefix``: as ``--store``/``--prefix`` (default: the
    environment's, as the CLI). Raises ``RequestError`` if CUDA is already
    initialised in this process. Once the hold is lost, ``LeaseLost`` is
    raised in this thread, or ``on_lost(why)`` called instead when given.
    """
    if cuda_initialised():
        raise RequestError(
            "CUDA is already initialised in this process, so it would not see the leased "
            "GPUs (CUDA reads CUDA_VISIBLE_DEVICES once): take the lease before any CUDA "
            "call, or restart the kernel"
        )
    seconds = wait_seconds(wait)
    if host is not None:
        from allocator.util.identity import check_this_host

        check_this_host(host)  # the GPUs are this process's: another host's would mean nothing
    allocator = _open(store, prefix)
    try:
        asked = (count, gpus, host, job, time)
        with _held(allocator, asked, ttl, seconds or None, on_lost) as grant:
            yield grant
    finally:
        allocator.store.close()


def wait_seconds(wait: str | float | None) -> float:
    """Seconds ``lease(wait=...)`` waits (pure): CLI durations, numbers, ``None`` is forever.

    ``ValueError`` with one line for anything else (a bool, a negative or
    unitless text), so a typo is not taken for a second.
    """
    from allocator.util.durations import parse_duration

    if wait is None or wait == "forever":
        return float("inf")
    if isinstance(wait, str):
        try:
            return parse_duration(wait)
        except ValueError as exc:
            raise ValueError(f"lease(wait={wait!r}): {exc}, or 'forever'") from None
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not wait >= 0:
        raise ValueError(
            f"lease(wait={wait!r}): expected a duration like '30m', seconds >= 0, or None (forever)"
        )
    return float(wait)


def _tell(line: str) -> None:
    """A line for whoever watches the process (a notebook shows stderr)."""
    print(f"allocator.lease: {line}", file=sys.stderr, flush=True)


def _log_waiting(why: str) -> None:
    """Why the lease waits in the queue: logged, for the program's logging to show or not."""
    import logging

    logging.getLogger(__name__).info("waiting: %s", why)


def _open(store: str | None, prefix: str | None) -> Any:
    from allocator.control.client import Allocator
    from allocator.records.keys import DEFAULT_PREFIX, validate_prefix
    from allocator.store import open_store, resolve_store_url

    chosen = validate_prefix(prefix or os.environ.get("ALLOCATOR_PREFIX") or DEFAULT_PREFIX)
    return Allocator(open_store(resolve_store_url(store)), prefix=chosen)


@contextmanager
def _held(
    allocator: Any,
    asked: tuple[int | None, Sequence[int] | None, str | None, str | None, str | None],
    ttl: float,
    wait: float | None,
    on_lost: Callable[[str], None] | None,
) -> Iterator[Grant]:
    from allocator.environments import worker_envs
    from allocator.placement.choose import Request
    from allocator.recipes.holding import default_job_name, let_go
    from allocator.recipes.waiting import take_waiting
    from allocator.records.holding import HOLDING_VARIABLE, holding_identity
    from allocator.util.identity import os_user, this_host

    count, gpus, host, job, time = asked
    request = Request(
        job=job or default_job_name(os_user(), os.urandom(2)),
        host=host or this_host(),
        gpus=tuple(gpus) if gpus else None,
        count=None if gpus else count,
        time=time,
    )
    reason = f"allocator.lease() in pid {os.getpid()}"
    alarm = LostAlarm(on_lost)
    holding = take_waiting(
        allocator,
        request,
        wait=wait,
        ttl=ttl,
        reason=reason,
        launched_by="lease",
        on_lost=alarm,
        tell=_tell,
        on_wait=_log_waiting,
    )
    status = 1
    saved: dict[str, str | None] = {}
    timer = _limit_timer(allocator, holding, alarm)
    try:
        envs, _ = worker_envs(allocator, request.job, request.host)
        held = holding.assignment
        env = {**envs[0], HOLDING_VARIABLE: holding_identity(held, allocator.layout.prefix) or ""}
        saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)
        alarm.arm()
        yield Grant(held.job, held.host, held.gpus if held.mode == "gpu" else (), dict(env))
        status = 0
    finally:
        if timer is not None:
            timer.cancel()
        raise_now = alarm.disarm() and status == 0  # lost, and no exception told the block
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        let_go(allocator, holding, status, "allocator.lease() ended")
    if raise_now:
        raise alarm.error()


def _limit_timer(allocator: Any, holding: Any, alarm: LostAlarm) -> threading.Timer | None:
    """At the holding's ``ends_at``: release it (history: ``time limit``), then tell the block."""
    from datetime import UTC, datetime

    from allocator.placement.time_limit import seconds_left
    from allocator.recipes.holding import let_go

    left = seconds_left(holding.assignment.ends_at, datetime.now(UTC))
    if left is None:
        return None

    def end() -> None:
        let_go(allocator, holding, 1, "time limit")
        alarm("its time limit was reached")

    timer = threading.Timer(left, end)
    timer.daemon = True
    timer.start()
    return timer


class LostAlarm:
    """Tells the holder the moment its hold is lost: ``on_lost``, else ``LeaseLost`` in its thread.

    Called from the lease's thread. The exception is raised asynchronously
    in the thread that took the lease (``PyThreadState_SetAsyncExc``), and
    only while the block runs: leaving the block cancels one not yet raised.
    """

    def __init__(self, on_lost: Callable[[str], None] | None) -> None:
        self._on_lost = on_lost
        self._thread = threading.get_ident()
        self._lock = threading.Lock()
        self._armed = False
        self._sent = False
        self.why: str | None = None

    def arm(self) -> None:
        """The block begins: a loss from now on is the block's to hear of."""
        with self._lock:
            self._armed = True
            lost_already = self.why is not None
        if lost_already:
            self._tell()

    def __call__(self, why: str) -> None:
        with self._lock:
            self.why = why
            armed = self._armed
        if armed:
            self._tell()

    def _tell(self) -> None:
        if self._on_lost is not None:
            self._on_lost(self.why or "")
            return
        with self._lock:
            if self._armed and not self._sent:
                self._sent = _raise_in(self._thread, self.error_type())

    def disarm(self) -> bool:
        """The block ended: cancel an exception not yet raised; whether one is owed still."""
        with self._lock:
            self._armed = False
            if self._sent:
                _raise_in(self._thread, None)  # already raised, or cancelled here
            return self._on_lost is None and self.why is not None and not self._sent

    def error_type(self) -> type[LeaseLost]:
        """``LeaseLost`` saying why (an asynchronous exception is raised from its class)."""
        message = f"the GPUs' hold was lost: {self.why}"

        class HoldLost(LeaseLost):
            def __init__(self, *args: object) -> None:
                super().__init__(*(args or (message,)))

        return HoldLost

    def error(self) -> LeaseLost:
        """The exception to raise in the holder's thread."""
        return self.error_type()()


def _raise_in(thread: int, error: type[BaseException] | None) -> bool:
    """Raise ``error`` in ``thread`` at its next instruction (None: cancel a pending one)."""
    import ctypes

    raised = ctypes.py_object(error) if error is not None else None
    return bool(ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), raised) == 1)
