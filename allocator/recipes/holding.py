"""Assignments held by a process, bound to a store lease (``allocator run``, ``lease()``).

A holding is an ordinary assignment, placed and written by the same
race-free transaction as a ``set`` (policy, reservations, health), with two
differences: it names the process that holds it (:class:`RunHolder`), and
the assignment and its job index entry are written under a store lease
that this process keeps alive from a daemon thread. When the process ends
it releases the assignment (with a history entry saying how the command
ended and the GPU-seconds it held) and revokes the lease; when it dies
(SIGKILL, a machine that stops) the lease expires and the store deletes
both keys, so its GPUs are free within the lease's TTL.

What an expiry leaves correct, and why:

* the job index entry goes with the assignment (same lease);
* the host's generation key is not bumped (nobody writes then). Every
  writer compares it, and a writer that read the assignment before it
  expired decides as if its GPUs were held, which is conservative, never a
  double booking; a client's kept view of a host holding a leased
  assignment is never reused (see :class:`~allocator.control.write_cache.ViewCache`);
* history has the start entry but no end entry: ``allocator usage`` ends
  such a holding at its last sign of life it can know (see
  :mod:`allocator.history.usage`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from allocator.errors import AllocatorError, LeaseLost, StoreError
from allocator.recipes.preempt_watch import PreemptWatch, preempted_by
from allocator.records.types import Assignment, LaunchedBy, RunHolder

if TYPE_CHECKING:
    from allocator.control.gate import Gate
    from allocator.placement.choose import Request
    from allocator.recipes.context import Context
    from allocator.store import Store

__all__ = [
    "DEFAULT_TTL",
    "Holding",
    "LeaseKeeper",
    "hold",
    "let_go",
    "own_start_ticks",
    "refresh_interval",
]

#: Seconds a holding outlives the process that stopped refreshing it.
DEFAULT_TTL = 15.0


def refresh_interval(ttl: float) -> float:
    """How often a lease of ``ttl`` seconds is refreshed: three tries before it expires."""
    return max(ttl / 3.0, 0.05)


def own_start_ticks(pid: int | None = None) -> int | None:
    """When ``pid`` (default: this process) started, in clock ticks (``/proc``'s field 22).

    With the pid it tells the agent which process tree holds the GPUs, even
    once the pid is reused. ``None`` where ``/proc`` cannot be read.
    """
    try:
        with open(f"/proc/{pid or os.getpid()}/stat", "rb") as stat:
            raw = stat.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    fields = raw[raw.rfind(b")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 else None


class LeaseKeeper:
    """Refreshes one lease from a daemon thread until stopped, or until it is lost.

    A refresh that fails because the store is unreachable is tried again;
    once the lease is gone (expired, revoked) ``on_lost`` is called once with
    the reason, from the keeper's thread.
    """

    def __init__(
        self,
        refresh: Callable[[], None],
        ttl: float,
        on_lost: Callable[[str], None],
        *,
        monotonic: Callable[[], float] = time.monotonic,
        every: float | None = None,
    ) -> None:
        self._refresh = refresh
        self._ttl = ttl
        self._every = refresh_interval(ttl) if every is None else min(every, refresh_interval(ttl))
        self._on_lost = on_lost
        self._monotonic = monotonic
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="allocator-lease", daemon=True)

    def start(self) -> None:
        """Begin refreshing."""
        self._thread.start()

    def stop(self) -> None:
        """Stop refreshing (the lease then lives out its TTL unless revoked)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        last_ok = self._monotonic()
        while not self._stop.wait(self._every):
            try:
                self._refresh()
                last_ok = self._monotonic()
            except LeaseLost as exc:
                self._on_lost(str(exc))
                return
            except (StoreError, OSError) as exc:
                if self._monotonic() - last_ok >= self._ttl:
                    self._on_lost(f"the store was unreachable for the lease's TTL: {exc}")
                    return


@dataclass
class Holding:
    """GPUs this process holds: the assignment, its lease, and when it began."""

    assignment: Assignment
    lease: int
    keeper: LeaseKeeper
    started: float
    lost: list[str] = field(default_factory=list)
    #: The job that took its GPUs back (a ``--preemptible`` holding), once it did.
    preempted_by: str = ""
    watch: PreemptWatch | None = None  # a preemptible holding's watch of its mark

    def gpu_seconds(self, now: float) -> float:
        """GPU-seconds held until ``now`` (monotonic); a CPU assignment holds none."""
        held = len(self.assignment.gpus) if self.assignment.mode == "gpu" else 0
        return held * max(now - self.started, 0.0)


def hold(
    allocator: Context,
    request: Request,
    *,
    ttl: float = DEFAULT_TTL,
    reason: str = "",
    launched_by: LaunchedBy = "run",
    on_lost: Callable[[str], None] | None = None,
    gate: Gate | None = None,
    on_preempted: Callable[[str], None] | None = None,
) -> Holding:
    """Take ``request``'s GPUs for this process under a new lease; keep the lease alive.

    ``gate``: the wait queue's turn (:mod:`allocator.recipes.queue.wait`), handed to
    ``Allocator.assign``. ``on_preempted`` hears, once, the job a
    ``--preemptible`` holding's GPUs go to (from a watch of its key,
    :mod:`allocator.recipes.preempt_watch`); the holder stops its command
    then and lets go.

    ``allocator`` is an :class:`~allocator.control.client.Allocator`, ``request``
    a placement :class:`~allocator.placement.choose.Request`. Refused exactly as
    a ``set`` would be (nothing held then, the lease revoked).
    """
    store = allocator.store
    lease = store.grant_lease(ttl)
    holder = RunHolder(
        pid=os.getpid(),
        start_ticks=own_start_ticks(),
        ttl=ttl,
        launched_by=launched_by,
    )
    lost: list[str] = []

    def lost_it(why: str) -> None:
        lost.append(why)
        if on_lost is not None:
            on_lost(why)

    try:
        assignment, _ = allocator.assign(request, reason=reason, held_by=(holder, lease), gate=gate)
    except BaseException:
        _revoke_quietly(store, lease)
        raise
    key = allocator.layout.assignment(assignment.host, assignment.job)
    holding: list[Holding] = []
    once = threading.Lock()

    def taken_back(by: str) -> None:
        with once:  # the watch and the keeper may both see the mark: tell once
            if not holding or holding[0].preempted_by:
                return
            holding[0].preempted_by = by
        if on_preempted is not None:
            on_preempted(by)

    def refresh() -> None:
        store.refresh_lease(lease)
        # An operator's `release` (or a `set` over it) takes the GPUs back: stop too.
        current = store.get(key)
        if current is None or current.lease != lease:
            raise LeaseLost(f"job {assignment.job!r} was released or changed by someone else")
        if assignment.preemptible and preempted_by(current.value):
            taken_back(preempted_by(current.value))  # should the watch have missed it

    keeper = LeaseKeeper(refresh, ttl, lost_it)
    watch = PreemptWatch(store, key, taken_back) if assignment.preemptible else None
    holding.append(Holding(assignment, lease, keeper, time.monotonic(), lost, watch=watch))
    keeper.start()
    if watch is not None:
        watch.start()
    return holding[0]


def let_go(allocator: Context, holding: Holding, exit_status: int, reason: str = "") -> bool:
    """Release ``holding`` (history: its exit status and GPU-seconds); revoke its lease.

    Returns whether the assignment was still this holding's to release (its
    lease may have expired, and the GPUs gone to someone else since).
    """
    holding.keeper.stop()
    if holding.watch is not None:
        holding.watch.stop()
    seconds = holding.gpu_seconds(time.monotonic())
    assignment = holding.assignment
    key = allocator.layout.assignment(assignment.host, assignment.job)
    released = False
    try:
        current = allocator.store.get(key)
        if current is not None and current.lease == holding.lease:
            allocator.release(
                assignment.host,
                assignment.job,
                reason=reason,
                if_revision=current.mod_revision,
                ended=(exit_status, seconds),
            )
            released = True
    except AllocatorError:
        released = False  # the lease, revoked below, frees the GPUs all the same
    finally:
        _revoke_quietly(allocator.store, holding.lease)
    return released


def _revoke_quietly(store: Store, lease: int) -> None:
    # Unreachable: the lease expires on its own within its TTL.
    with contextlib.suppress(AllocatorError):
        store.revoke_lease(lease)


def default_job_name(user: str, token: bytes) -> str:
    """``run-<user>-<4 hex>``: says who ran it; the hex tells two runs apart (pure)."""
    import re

    cleaned = re.sub(r"[^a-z0-9-]+", "-", user.lower()).strip("-")[:32] or "user"
    return f"run-{cleaned}-{token.hex()[:4]}"
