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
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from allocator.agent.processes import procs
from allocator.records.holding import HOLDING_VARIABLE, holding_identity
from allocator.records.types import Assignment

__all__ = ["HOLDING_GRACE", "Ending", "HoldingEnds", "carriers", "next_step"]

#: Seconds between the SIGTERM to a holding's leftovers and their SIGKILL.
HOLDING_GRACE = 5.0

Step = Literal["done", "term", "kill", "wait"]


@dataclass
class Ending:
    """One ended holding whose processes are being stopped."""

    job: str
    identity: str
    term_at: float | None = None  # when the first SIGTERM went out
    seen: dict[int, int] = field(default_factory=dict)  # pid -> start ticks, all ever found
    killed: bool = False


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


def carriers(identities: set[str], proc: Path = Path("/proc")) -> dict[str, dict[int, int]]:
    """The live processes whose environment names one of ``identities``: pid -> start ticks."""
    wanted = {f"{HOLDING_VARIABLE}={i}".encode(): i for i in identities}
    found: dict[str, dict[int, int]] = {}
    own = os.getpid()
    for entry in proc.iterdir() if wanted else ():
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:  # another user's process needs root to read; a vanished one is gone anyway
            variables = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for variable in variables:
            identity = wanted.get(variable)
            stat = procs.read_stat(int(entry.name)) if identity else None
            if identity and stat is not None and stat.state != "Z":
                found.setdefault(identity, {})[stat.pid] = stat.start_ticks
    return found


class HoldingEnds:
    """The holdings that ended on this host and whose processes are still being stopped."""

    def __init__(
        self,
        log: Callable[[str, Mapping[str, Any]], None],
        *,
        grace: float = HOLDING_GRACE,
        proc: Path = Path("/proc"),
    ) -> None:
        self._log = log
        self._grace = grace
        self._proc = proc
        self._endings: dict[str, Ending] = {}

    @property
    def active(self) -> bool:
        """Whether some holding's processes are still being stopped."""
        return bool(self._endings)

    def end(self, held: Assignment) -> None:
        """``held`` left the store: stop whatever of it still runs (from the next tick on)."""
        identity = holding_identity(held)
        if identity is not None and identity not in self._endings:
            self._endings[identity] = Ending(held.job, identity)

    def tick(self, now: float) -> None:
        """Look once more: signal what is left, forget the holdings with nothing left."""
        if not self._endings:
            return
        found = carriers(set(self._endings), self._proc)
        for identity, ending in list(self._endings.items()):
            self._act(ending, found.get(identity, {}), now)

    def _act(self, ending: Ending, found: dict[int, int], now: float) -> None:
        step = next_step(ending, found, now, self._grace)
        if step == "done":
            del self._endings[ending.identity]
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
