"""The host's enforcer: when a holding ends, nothing of it is left running.

``allocator run`` and ``allocator.lease()`` put the holding's identity
(:mod:`allocator.records.holding`) into the environment of everything they
start. When such a holding's assignment leaves the store (released, or its
lease expired because ``run`` was killed with SIGKILL, paused, or cut off
from the store), the agent scans ``/proc`` for every process whose
environment still carries that identity, whatever session, wrapper or
parent it has now, and stops it as it stops its own workers: SIGTERM (and
SIGCONT, so a stopped process can act on it), then SIGKILL after
:data:`HOLDING_GRACE` seconds. The holder process itself never matches: a
process's ``/proc`` environment is the one it started with, and only its
children got the variable.

:func:`next_step` decides (pure); :class:`HoldingEnds` does the reads and
signals, a little on each tick of the agent's loop, so a slow stop never
holds up the loop.

An agent that was stopped or cut off when a holding ended never saw it go.
So every :data:`SWEEP_SECONDS` (and once it first knows its assignments) it
also looks for processes carrying an identity of its host that no current
assignment has, and whose holding process is gone (:func:`orphaned`): a
holder still alive may hold an assignment the agent has not read yet. It
leaves alone processes younger than :data:`SETTLE_SECONDS`, so a holding
just taken (its holder in another pid namespace, its assignment not read
yet) is never mistaken for one that ended.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from allocator.agent.kernel import procs
from allocator.agent.kernel.cgroups import (
    RUNS_SCOPE,
    cgroup_members,
    process_cgroup,
    remove_cgroup,
)
from allocator.records.holding import HOLDING_VARIABLE, holding_identity
from allocator.records.types import Assignment
from allocator.util.process_environ import variables_of_processes

__all__ = [
    "HOLDING_GRACE",
    "SETTLE_SECONDS",
    "SWEEP_SECONDS",
    "Ending",
    "HoldingEnds",
    "carriers",
    "next_step",
    "orphaned",
]

#: Seconds between the SIGTERM to a holding's leftovers and their SIGKILL.
HOLDING_GRACE = 5.0
#: How often the agent looks for leftovers of holdings whose end it did not see.
SWEEP_SECONDS = 30.0
#: How old every process of a holding must be before a sweep may end it.
SETTLE_SECONDS = 5.0

Step = Literal["done", "term", "kill", "wait"]


@dataclass
class Ending:
    """One ended holding whose processes are being stopped."""

    job: str
    identity: str
    term_at: float | None = None  # when the first SIGTERM went out
    seen: dict[int, int] = field(default_factory=dict)  # pid -> start ticks, all ever found
    killed: bool = False
    cgroups: set[Path] = field(default_factory=set)  # the run's cgroup, where it had one


def next_step(ending: Ending, found: Mapping[int, int], now: float, grace: float) -> Step:
    """What to do about ``ending`` now that ``found`` still carry its identity (pure)."""
    if not found:
        return "done"
    if ending.term_at is None:
        return "term"
    if now - ending.term_at >= grace:
        return "kill"
    if any(pid not in ending.seen for pid in found):
        return "term"  # forked since the last look: it is asked too
    return "wait"


def orphaned(
    identity: str, where: tuple[str, str], current: set[str], alive: Callable[[int, int], bool]
) -> bool:
    """Whether ``identity`` is a holding ``where`` (prefix, host) that ended unseen.

    Pure but for ``alive``: not among the ``current`` assignments'
    identities, and its holding process (``alive(pid, start ticks)``) is gone.
    """
    prefix, host = where
    named, _, holder = identity.rpartition("/")
    if not (named.startswith(f"{prefix}:") and named.endswith(f"@{host}")) or identity in current:
        return False
    pid, _, ticks = holder.partition(".")
    if not (pid.isdigit() and ticks.isdigit()):
        return False
    return not alive(int(pid), int(ticks))


def carriers(identities: set[str] | None, proc: Path = Path("/proc")) -> dict[str, dict[int, int]]:
    """The live processes whose environment names one of ``identities`` (None: any holding).

    Per identity: pid -> start ticks.
    """
    found: dict[str, dict[int, int]] = {}
    if identities is not None and not identities:
        return found
    for pid, variables in variables_of_processes((HOLDING_VARIABLE,), proc):
        text = variables[HOLDING_VARIABLE].decode(errors="replace")
        if identities is not None and text not in identities:
            continue
        stat = procs.read_stat(pid)
        if stat is not None and stat.state != "Z":
            found.setdefault(text, {})[stat.pid] = stat.start_ticks
    return found


class HoldingEnds:
    """The holdings that ended on this host and whose processes are still being stopped."""

    def __init__(
        self,
        log: Callable[[str, Mapping[str, Any]], None],
        prefix: str,
        *,
        grace: float = HOLDING_GRACE,
        proc: Path = Path("/proc"),
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._log = log
        self._prefix = prefix
        self._grace = grace
        self._proc = proc
        self._wall = wall
        self._endings: dict[str, Ending] = {}
        self._next_sweep: float | None = None  # the first sweep comes with the first view

    @property
    def active(self) -> bool:
        """Whether some holding's processes are still being stopped."""
        return bool(self._endings)

    def end(self, held: Assignment) -> None:
        """``held`` left the store: stop whatever of it still runs (from the next tick on)."""
        identity = holding_identity(held, self._prefix)
        if identity is not None and identity not in self._endings:
            self._endings[identity] = Ending(held.job, identity)

    def sweep(self, now: float, host: str, assignments: Mapping[str, Assignment]) -> None:
        """Every :data:`SWEEP_SECONDS`: end the holdings of ``host`` that ended unseen."""
        if self._next_sweep is not None and now < self._next_sweep:
            return
        next_sweep = now + SWEEP_SECONDS
        held = (holding_identity(a, self._prefix) for a in assignments.values())
        current = {identity for identity in held if identity is not None}
        for identity, found in carriers(None, self._proc).items():
            if identity in self._endings or not orphaned(
                identity, (self._prefix, host), current, procs.same_process_alive
            ):
                continue
            youngest = min(self._age(ticks) for ticks in found.values())
            if youngest < SETTLE_SECONDS:  # look again once it has settled
                next_sweep = min(next_sweep, now + SETTLE_SECONDS - youngest)
                continue
            job = identity.rpartition("/")[0].rpartition("@")[0].rpartition(":")[2]
            self._endings[identity] = Ending(job, identity)
        self._next_sweep = next_sweep

    def _age(self, start_ticks: int) -> float:
        started = procs.ticks_to_epoch(start_ticks)
        return 0.0 if started is None else self._wall() - started

    def tick(self, now: float) -> None:
        """Look once more: signal what is left, forget the holdings with nothing left."""
        if not self._endings:
            return
        found = carriers(set(self._endings), self._proc)
        for identity, ending in list(self._endings.items()):
            mine = found.get(identity, {})
            # A process that cleared its environment is still in the run's cgroup.
            ending.cgroups.update(_run_cgroups(mine))
            self._act(ending, {**mine, **_members(ending.cgroups)}, now)

    def _act(self, ending: Ending, found: dict[int, int], now: float) -> None:
        step = next_step(ending, found, now, self._grace)
        if step == "done":
            del self._endings[ending.identity]
            for cgroup in ending.cgroups:
                remove_cgroup(cgroup)
            if ending.seen:
                self._log("holding-stopped", self._fields(ending))
            return
        if step == "wait":
            return
        signum = signal.SIGKILL if step == "kill" else signal.SIGTERM
        for pid, ticks in found.items():
            if procs.same_process_alive(pid, ticks):  # the pid may be someone else's by now
                procs.signal_process(pid, signum)
                procs.signal_process(pid, signal.SIGCONT)
        ending.seen.update(found)
        ending.killed = ending.killed or step == "kill"
        if ending.term_at is None:
            ending.term_at = now
            self._log("holding-stopping", self._fields(ending))

    def _fields(self, ending: Ending) -> dict[str, Any]:
        return {
            "job": ending.job,
            "holding": ending.identity,
            "pids": sorted(ending.seen),
            "killed": ending.killed,
            "grace_seconds": self._grace,
        }


def _run_cgroups(found: Mapping[int, int]) -> set[Path]:
    """The cgroups ``allocator run`` made for its command that ``found`` are in."""
    cgroups = (process_cgroup(pid) for pid in found)
    return {
        c
        for c in cgroups
        if c is not None and c.parent.name == RUNS_SCOPE and c.name.startswith("run-")
    }


def _members(cgroups: set[Path]) -> dict[int, int]:
    """The live processes of ``cgroups``: pid -> start ticks."""
    members: dict[int, int] = {}
    for cgroup in cgroups:
        for pid in cgroup_members(cgroup):
            stat = procs.read_stat(pid)
            if stat is not None and stat.state != "Z":
                members[pid] = stat.start_ticks
    return members
