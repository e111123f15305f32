"""One job per GPU on an exclusive host, whatever the store says (pure).

``allocator set`` never gives one GPU of an exclusive pool to two jobs, but
the store can be written around it (``etcdctl put``, a buggy script, a
restored backup). The agent is the last line: when two jobs that would run
claim the same GPU, one keeps it and the other is refused, with a message
naming the holder that its worker record and ``allocator status`` show.

Who keeps the GPU: a job whose workers already run on it (live workers are
never displaced by a newcomer), else the assignment written first (lower
store revision), else the job whose name sorts first.

A GPU handed from one job to another is not a conflict: the old job no
longer claims it, and the planner only holds the new job's start until the
old workers are gone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from allocator.agent.planning.types import DesiredJob, JobView

__all__ = ["gpu_holders", "refuse_double_claims"]


def gpu_holders(views: Mapping[str, JobView]) -> dict[str, tuple[int, ...]]:
    """GPUs each job's live workers run on (jobs on CPU or without live workers left out)."""
    return {
        job: view.gpus
        for job, view in sorted(views.items())
        if view.device == "cuda" and view.alive > 0 and view.gpus
    }


def refuse_double_claims(
    desired: Mapping[str, DesiredJob],
    holders: Mapping[str, tuple[int, ...]],
    pool: str | None,
    empty_fingerprint: str,
) -> dict[str, DesiredJob]:
    """``desired`` with every job that would share a GPU with an earlier claimant refused.

    ``pool`` names the host's exclusive pool in the message (``None``: no pool,
    which is exclusive too); ``empty_fingerprint`` is the fingerprint of no workers.
    """
    claimed: dict[int, str] = {}
    result = dict(desired)
    for name in sorted(desired, key=lambda job: _priority(desired[job], holders)):
        want = desired[name]
        if want.state != "run" or want.device != "cuda":
            continue
        clash = [gpu for gpu in want.gpus if gpu in claimed]
        if not clash:
            claimed.update({gpu: name for gpu in want.gpus})
            continue
        holder = claimed[clash[0]]
        result[name] = replace(
            want,
            state="refused",
            workers=(),
            fingerprint=empty_fingerprint,
            message=_refusal(name, clash, holder, holder in holders, pool),
        )
    return result


def _priority(want: DesiredJob, holders: Mapping[str, tuple[int, ...]]) -> tuple[int, int, str]:
    runs_there = bool(set(holders.get(want.job, ())) & set(want.gpus))
    return (0 if runs_there else 1, want.assignment_revision, want.job)


def _refusal(job: str, gpus: list[int], holder: str, running: bool, pool: str | None) -> str:
    which = ",".join(str(gpu) for gpu in gpus)
    held = "runs on it" if running else "was assigned it first"
    where = f"exclusive pool {pool!r}" if pool else "this host's GPUs are exclusive"
    return (
        f"GPU {which} is also assigned to job {holder!r}, which {held} ({where}); job "
        f"{job!r} is not started on it. One of the two assignments was written around "
        "`allocator set`: release or move one of them"
    )
