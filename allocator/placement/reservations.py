"""Reservation windows: which GPUs a job may not hold at a given time, and which it will lose.

Pure decisions over the policy and a time that is passed in. The same
functions serve ``set`` (judged by the operator's clock, with a warning for
a window that opens later), ``status`` (flagging a holder inside a window it
is not part of) and the agent (judged by the agent's own clock, where the
reservation is enforced: a holder the reservation does not cover loses the
GPU at the window's start, as if it were unavailable).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from allocator.policy.model import Policy, Reservation
from allocator.records.types import Assignment
from allocator.util.times import format_time

__all__ = [
    "active_reservations",
    "asker_of_assignment",
    "describe_reservation",
    "on_host",
    "reserved_against",
    "reserved_later",
    "trespassers",
    "unavailable_gpus",
    "upcoming_conflicts",
]


# One index of the latest policy's reservations by host (status reads every host).
_INDEX: dict[int, tuple[tuple[Reservation, ...], dict[str, tuple[Reservation, ...]]]] = {}


def on_host(policy: Policy, host: str) -> tuple[Reservation, ...]:
    """The reservations of ``host``, from an index built once per policy."""
    key = id(policy.reservations)
    entry = _INDEX.get(key)
    if entry is None or entry[0] is not policy.reservations:
        index: dict[str, list[Reservation]] = {}
        for reservation in policy.reservations:
            index.setdefault(reservation.host, []).append(reservation)
        entry = (policy.reservations, {name: tuple(found) for name, found in index.items()})
        _INDEX.clear()
        _INDEX[key] = entry
    return entry[1].get(host, ())


def describe_reservation(reservation: Reservation) -> str:
    """``reserved by 'r' for eval-* until 2030-01-01T00:00:00Z`` (or ``with no end``)."""
    until = (
        f"until {format_time(reservation.until)}"
        if reservation.until is not None
        else "with no end"
    )
    kept_for = ", ".join((*reservation.for_jobs, *reservation.who))
    return f"reserved by '{reservation.name}' for {kept_for} {until}"


def asker_of_assignment(policy: Policy, assignment: Assignment) -> tuple[tuple[str, ...], bool]:
    """Who asked for ``assignment`` as reservations see it, and whether it is self-service.

    Its recorded subjects, its holder (``user:``) and the holder's teams in
    ``policy``; a holding of ``run`` or ``lease()`` is self-service.
    """
    holder = assignment.holder
    subjects = {*assignment.asker, f"user:{holder}"} if holder else set(assignment.asker)
    if holder:
        subjects |= {f"team:{t.name}" for t in policy.teams.values() if holder in t.members}
    return tuple(sorted(subjects)), assignment.run is not None


def active_reservations(policy: Policy, host: str, now: datetime) -> tuple[str, ...]:
    """Names of the reservations on ``host`` in force at ``now``.

    The agent recomputes what should run whenever this changes, which is
    exactly when a window opens or closes.
    """
    return tuple(r.name for r in on_host(policy, host) if r.active(now))


def reserved_against(
    policy: Policy,
    host: str,
    job: str,
    now: datetime,
    gpus: Iterable[int] | None = None,
    asker: Sequence[str] = (),
    *,
    self_service: bool = False,
) -> dict[int, Reservation]:
    """GPU -> the first reservation on ``host`` in force at ``now`` that does not admit ``job``.

    ``gpus`` limits the answer to those GPUs (all of the host's otherwise);
    ``asker`` and ``self_service``: who asks (see ``Reservation.admits``).
    """
    wanted = None if gpus is None else set(gpus)
    blocked: dict[int, Reservation] = {}
    for reservation in on_host(policy, host):
        if not reservation.active(now) or reservation.admits(job, asker, self_service=self_service):
            continue
        for gpu in reservation.gpus:
            if wanted is None or gpu in wanted:
                blocked.setdefault(gpu, reservation)
    return blocked


def reserved_later(
    policy: Policy,
    host: str,
    job: str,
    now: datetime,
    gpus: Iterable[int] | None = None,
    asker: Sequence[str] = (),
    *,
    self_service: bool = False,
) -> dict[int, Reservation]:
    """GPU -> the earliest reservation not admitting ``job`` that starts after ``now``."""
    wanted = None if gpus is None else set(gpus)
    later: dict[int, Reservation] = {}
    for reservation in on_host(policy, host):
        start = reservation.start
        if start is None or start <= now:
            continue
        if reservation.admits(job, asker, self_service=self_service):
            continue
        for gpu in reservation.gpus:
            if wanted is not None and gpu not in wanted:
                continue
            first = later.get(gpu)
            if first is None or (first.start is not None and start < first.start):
                later[gpu] = reservation
    return later


def unavailable_gpus(
    policy: Policy,
    assignment: Assignment,
    unhealthy: Mapping[int, str],
    now: datetime | None,
) -> tuple[dict[int, str], bool]:
    """Which of an assignment's GPUs it cannot use now, why, and whether a reservation is why.

    The agent's decision at a window's start: a GPU held by a job the
    reservation does not cover is unavailable to that job, like an unhealthy
    one, so the job's fallback rule applies. ``now`` is the agent's clock;
    ``None`` judges health alone. Reasons read ``unhealthy: XID 79`` or
    ``reserved by 'r' for eval-* until ...``.
    """
    if assignment.mode != "gpu":
        return {}, False
    asker, own = asker_of_assignment(policy, assignment)
    host, job, held = assignment.host, assignment.job, assignment.gpus
    reserved = (
        {}
        if now is None
        else reserved_against(policy, host, job, now, held, asker, self_service=own)
    )
    reasons: dict[int, str] = {}
    for gpu in assignment.gpus:
        if gpu in unhealthy:
            reasons[gpu] = f"unhealthy: {unhealthy[gpu]}"
        elif gpu in reserved:
            reasons[gpu] = describe_reservation(reserved[gpu])
    return reasons, any(gpu in reserved for gpu in reasons)


def trespassers(
    policy: Policy,
    host: str,
    holders: Mapping[int, list[str]],
    now: datetime,
    assignments: Mapping[str, Assignment] | None = None,
) -> dict[int, str]:
    """GPU -> a line naming each holder inside a window in force that does not admit it.

    ``assignments`` (job -> record): who asked for each, for reservations' ``who``.
    """
    flagged: dict[int, str] = {}
    if not any(r.active(now) for r in on_host(policy, host)):
        return flagged
    for gpu, jobs in holders.items():
        outside: list[str] = []
        for job in jobs:
            record = (assignments or {}).get(job)
            asker, own = asker_of_assignment(policy, record) if record else ((), False)
            against = reserved_against(policy, host, job, now, (gpu,), asker, self_service=own)
            blocked = against.get(gpu)
            if blocked is not None:
                outside.append(f"'{job}' is not in reservation '{blocked.name}'")
        if outside:
            flagged[gpu] = "; ".join(outside)
    return flagged


def upcoming_conflicts(
    policy: Policy, host: str, held: Mapping[str, tuple[int, ...]], now: datetime
) -> list[str]:
    """One line per GPU a job holds on ``host`` that a reservation takes from it later.

    ``held`` maps each job to the GPUs it holds (GPU mode). ``policy diff``
    and ``apply`` report these: the agent will move the job to its fallback
    when the window opens.
    """
    found: list[str] = []
    for job, gpus in sorted(held.items()):
        for gpu, reservation in sorted(reserved_later(policy, host, job, now, gpus).items()):
            start = format_time(reservation.start) if reservation.start is not None else "now"
            found.append(
                f"{job}@{host}: GPU {gpu} is {describe_reservation(reservation)} from {start}"
            )
    return found
