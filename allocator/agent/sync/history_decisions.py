"""Which of the agent's decisions go into the host's history (pure).

An operator's ``set`` and ``release`` write their own entries; what the agent
decides by itself is found here by comparing what it wanted before with what
it wants now, for the same assignment:

* ``fallback``: a job on GPUs moves to the CPU, or stops to wait, because a
  GPU is unhealthy (or a reservation window took it);
* ``recover``: it returns to its GPUs;
* ``gave-up``: a ``fail`` fallback rule marks it failed, or its workers
  crash-looped past ``max_restarts``;
* ``held``: the flap limit keeps it in its fallback although its GPUs are back;
* ``failed``: a share of a job across hosts finished here, and another
  share's crash is the job's result (its GPUs are kept; recorded by the
  agent that saw its share finish, once).

A new assignment is the operator's entry, not a decision: only changes
under one assignment revision are recorded. An agent that restarts compares
against nothing, so it never records again what the agent before it did.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from allocator.agent.planning.types import Action, DesiredJob, GiveUp, Pin
from allocator.records.types import Assignment, HistoryEntry, JobPlace

__all__ = ["DecisionRecorder", "agent_actor", "place_of"]


def agent_actor(host: str) -> str:
    """Who the agent's entries say made them."""
    return f"agent@{host}"


def place_of(want: DesiredJob, assignment: Assignment) -> JobPlace | None:
    """Where a job on GPUs is meant to be: ``gpu``, ``cpu`` (fallback), ``stopped``.

    ``None`` for what health does not move: a CPU assignment, a refused or
    undeclared job.
    """
    if assignment.mode != "gpu" or want.state in ("refused", "undeclared"):
        return None
    if want.state == "run":
        return "gpu" if want.device == "cuda" else "cpu"
    return "stopped"


class DecisionRecorder:
    """Turns the agent's successive desired states and actions into history entries."""

    def __init__(self, host: str, pinned: Iterable[str] = ()) -> None:
        """``pinned``: jobs already held when the agent started (recorded by an earlier run)."""
        self.host = host
        self.by = agent_actor(host)
        self._pinned = frozenset(pinned)

    def desired_changed(
        self,
        before: Mapping[str, DesiredJob],
        after: Mapping[str, DesiredJob],
        pins: Mapping[str, Pin],
        assignments: Mapping[str, Assignment],
        at: str,
    ) -> list[HistoryEntry]:
        """Entries for every job whose place changed under the same assignment, and new pins."""
        entries = []
        for job, want in sorted(after.items()):
            old = before.get(job)
            held = assignments.get(job)
            if old is None or held is None or old.assignment_revision != want.assignment_revision:
                continue
            entry = self._moved(old, want, held, at)
            if entry is not None:
                entries.append(entry)
        for job in sorted(pins.keys() - self._pinned):
            pinned, held = after.get(job), assignments.get(job)
            if pinned is not None and held is not None:
                place = place_of(pinned, held) or "stopped"
                entries.append(self._entry("held", held, place, place, pins[job].note, at))
        self._pinned = frozenset(pins)
        return entries

    def actions(
        self,
        actions: Iterable[Action],
        desired: Mapping[str, DesiredJob],
        assignments: Mapping[str, Assignment],
        at: str,
    ) -> list[HistoryEntry]:
        """Entries for planned actions that are decisions of their own (giving up on a job)."""
        entries = []
        for action in actions:
            held, want = assignments.get(action.job), desired.get(action.job)
            if isinstance(action, GiveUp) and held is not None:
                was = (place_of(want, held) if want is not None else None) or held.mode
                entries.append(self._entry("gave-up", held, was, "stopped", action.reason, at))
        return entries

    def job_failed(self, held: Assignment, reason: str, at: str) -> HistoryEntry:
        """The entry of a finished share whose job another share's crash ended (``failed``)."""
        return self._entry("failed", held, held.mode, "stopped", reason, at)

    def _moved(
        self, old: DesiredJob, new: DesiredJob, held: Assignment, at: str
    ) -> HistoryEntry | None:
        was, now = place_of(old, held), place_of(new, held)
        if was is None or now is None or was == now:
            return None
        if new.state == "failed":
            return self._entry("gave-up", held, was, "stopped", new.message, at)
        if now == "gpu":
            why = old.fallback_reason or old.message
            reason = "its GPUs are back in service" + (f" (was: {why})" if why else "")
            return self._entry("recover", held, was, now, reason, at)
        reason = new.fallback_reason if now == "cpu" and new.fallback_reason else new.message
        return self._entry("fallback", held, was, now, reason, at)

    def _entry(
        self, action: str, held: Assignment, was: JobPlace, now: JobPlace, reason: str, at: str
    ) -> HistoryEntry:
        return HistoryEntry(
            seq=0,
            at=at,
            by=self.by,
            action=action,
            host=self.host,
            job=held.job,
            from_mode=was,
            from_gpus=held.gpus if was == "gpu" else (),
            to_mode=now,
            to_gpus=held.gpus if now == "gpu" else (),
            reason=reason[:4096],
        )
