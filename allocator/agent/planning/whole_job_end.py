"""The end of a job across hosts, judged by all its shares (pure).

A share whose workers ended at a ``release_on_exit`` status has finished
its part; the job is released (whole, by whichever agent judges it first)
only when every other share has ended too, and its result is the worst of
them all: a crash anywhere is the job's result, not the first exit 0.

Each other host's share, as its worker record last said (at the same
assignment, :meth:`PeerShare.reports_on`):

* still running, stopping, crashed and waiting for its restart, restarted
  (its restart rule retries it): the job has not ended; this share waits;
* finished at a status the job's ``release_on_exit`` names: ended well (a
  crash restart on the way is named in the release's reason);
* finished at another status (``restart: never``), gave up, failed: that is
  the job's result; nothing is released, and this share's status says why;
* its agent is gone (its leased record expired: a dead host, a killed
  agent) while its share had not ended: the share is judged by that agent's
  liveness. After ``grace`` seconds gone (an agent restarting comes back
  sooner) its share counts as ended, its end unknown, and the job is
  released: a peer that never returns never holds the job's GPUs for ever;
* its agent alive but no report on the current assignment yet: the share
  is starting (both agents saw the assignment at about the same moment, and
  this share may end before the other's first report); the job has not
  ended, this share waits. After ``grace`` seconds without a report (an
  agent that cannot run it reports so sooner) its end counts as unknown and
  the job is released, as for a gone agent;
* a host this agent may not read holds nothing up (nothing is known of it).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from allocator.agent.planning.across_hosts import PeerHost
from allocator.agent.planning.exit_codes import describe_exit
from allocator.records.types import Assignment, WorkerRecord

__all__ = ["WholeJobEnd", "agents_gone_since", "shares_unreported_since", "whole_job_end"]

#: A share's states that are the job's result when they are its end.
_FAILED = {"gave-up": "gave up", "failed": "failed"}


@dataclass(frozen=True, slots=True)
class WholeJobEnd:
    """Whether to release the whole job now, and why (or what its status says meanwhile)."""

    release: bool
    reason: str
    failed: bool = False  # another share's end is the job's result (not a wait)


def agents_gone_since(
    before: Mapping[str, float], peers: Mapping[str, PeerHost], now: float
) -> dict[str, float]:
    """Each readable peer host whose agent is gone -> since when it is seen gone."""
    return {
        host: before.get(host, now)
        for host, peer in peers.items()
        if peer.readable and not peer.agent_alive
    }


def shares_unreported_since(
    before: Mapping[tuple[str, str], float],
    held: Mapping[str, Assignment],
    peers: Mapping[str, PeerHost],
    now: float,
) -> dict[tuple[str, str], float]:
    """Each (peer host, job across hosts) whose live agent has not reported on the job's
    current assignment -> since when it is seen so."""
    found: dict[tuple[str, str], float] = {}
    for job, mine in held.items():
        for node in mine.nodes if len(mine.nodes) > 1 else ():
            peer = peers.get(node)
            if node == mine.host or peer is None or not peer.readable or not peer.agent_alive:
                continue
            share = peer.shares.get(job)
            if share is None or share.reports_on(mine) is None:
                found[node, job] = before.get((node, job), now)
    return found


def whole_job_end(
    assignment: Assignment,
    own_end: str,
    release_on_exit: Collection[int],
    peers: Mapping[str, PeerHost],
    gone_for: Mapping[str, float],
    grace: float,
    own_crash_restarts: int = 0,
    unreported_for: Mapping[str, float] | None = None,
) -> WholeJobEnd:
    """Judge the job of ``assignment``, whose share here finished as ``own_end`` says.

    ``own_end`` is this share's end (``finished (exit 0); its GPUs released
    (release_on_exit)``), after ``own_crash_restarts``; ``gone_for``:
    seconds each peer host's agent has been seen gone; ``unreported_for``:
    seconds each peer host's live agent has had no report on this assignment.
    """
    kept: list[str] = []
    waiting: list[str] = []
    notes = [_restarted(assignment.host, own_crash_restarts)] if own_crash_restarts else []
    for node in assignment.nodes:
        peer = peers.get(node)
        if node == assignment.host or peer is None or not peer.readable:
            continue
        share = peer.shares.get(assignment.job)
        worker = share.reports_on(assignment) if share is not None else None
        ended = _ended(node, worker, release_on_exit)
        if ended is not None:
            failed, said = ended
            (kept if failed else notes).extend([said] if said else [])
        elif not peer.agent_alive:
            gone = gone_for.get(node, 0.0)
            if gone < grace:
                waiting.append(f"{node}'s agent, gone for {gone:.0f}s")
            else:
                notes.append(f"{node}'s agent is gone ({gone:.0f}s): its share's end is unknown")
        elif worker is not None:
            waiting.append(f"{node}'s share ({worker.state})")
        else:  # alive, no report on this assignment yet: starting
            quiet = (unreported_for or {}).get(node, 0.0)
            if quiet < grace:
                waiting.append(f"{node}'s share (starting)")
            else:
                notes.append(f"{node}'s share never reported ({quiet:.0f}s): its end is unknown")
    words = own_end.split("; ")[0]  # "finished (exit 0)", without what it would release
    if kept:
        reason = f"{words}; {kept[0]}: that is the job's result; GPUs kept"
        return WholeJobEnd(False, reason, failed=True)
    if waiting:
        why = ", ".join(waiting)
        return WholeJobEnd(False, f"{words}; the job's GPUs go once every share ends ({why})")
    return WholeJobEnd(True, "; ".join([own_end, *notes]))


def _ended(
    node: str, worker: WorkerRecord | None, release_on_exit: Collection[int]
) -> tuple[bool, str] | None:
    """``None`` while ``node``'s share has not ended (or nothing is known of it), else
    (whether its end is the job's failure, and what to say of it, if anything)."""
    if worker is None:
        return None
    if worker.state in _FAILED:
        return True, f"{node}'s share {_FAILED[worker.state]}"
    if worker.state != "finished":
        return None
    status = worker.last_exit if worker.last_exit is not None else 0
    if status not in release_on_exit:
        return True, f"{node}'s share ended with exit {describe_exit(status)}"
    return False, _restarted(node, worker.crash_restarts) if worker.crash_restarts else ""


def _restarted(node: str, crash_restarts: int) -> str:
    plural = "s" if crash_restarts > 1 else ""
    return f"{node}'s share finished after {crash_restarts} crash restart{plural}"
