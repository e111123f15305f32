"""The queue as people see it (``allocator queue``, ``status``, the API), and quota looks.

Each entry's ``why`` is decided as its own take would decide it, from one
read of its host: the GPUs it asks for held (``GPU 3 held by job
'train'``), reserved or unhealthy, its holder over a quota (``over quota
team-a 8/8 GPUs``), or a request ahead of it that could use them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from allocator.control.holder import asker_of, needs_groups, quota_subjects, unix_groups
from allocator.control.quotas import (
    absent_charges,
    ask_of_entry,
    charged_assignments,
    counter_key,
    quota_refusal,
    read_counters,
)
from allocator.errors import AllocatorError, NotFound, PermissionDenied
from allocator.recipes.queue.order import Able, Waiting, blockers, decode_queue
from allocator.records.keys import KeyLayout
from allocator.store import Compare, Delete, KeyValue, Listing

if TYPE_CHECKING:
    from allocator.placement.choose import Placement
    from allocator.policy.model import Policy
    from allocator.recipes.context import Context
    from allocator.records.holders import QueueEntry
    from allocator.records.types import Assignment
    from allocator.status.snapshots import HostSnapshot

__all__ = [
    "QueueLine",
    "QuotaLook",
    "able_gpus",
    "entry_asker",
    "normal_fits",
    "queue_lines",
    "queue_prefix",
    "remove_entry",
]


class QuotaLook:
    """Whether a waiting request's holder is over a quota now; the counters it looked at."""

    def __init__(self, allocator: Context, policy: Policy) -> None:
        self.allocator, self.policy = allocator, policy
        self._seen: dict[str, KeyValue | None] = {}
        self._groups: dict[str, tuple[str, ...]] = {}
        self._looked: set[str] = set()  # charges whose assignment key was read
        self._gone: set[str] = set()  # those of them found absent

    def subjects(self, holder: str) -> tuple[str, ...]:
        """The quota subjects of ``holder`` (its unix groups as this machine knows them)."""
        if holder not in self._groups:
            named = any(q.who.startswith("unix:") for q in self.policy.quotas)
            self._groups[holder] = unix_groups(holder) if named else ()
        return quota_subjects(self.policy, holder, self._groups[holder])

    def refusal(self, waiting: Waiting) -> str | None:
        """``over quota ...`` when ``waiting``'s request would take its holder over a quota."""
        if not self.policy.quotas:
            return None
        entry = waiting.entry
        subjects = self.subjects(entry.holder)
        missing = [s for s in subjects if s not in self._seen]
        if missing:
            store, layout = self.allocator.store, self.allocator.layout
            try:
                self._seen.update(read_counters(store, layout, missing))
            except PermissionDenied:  # a viewer who may not read the counters: not known
                return None
        pool = self.policy.pool_of(entry.host)
        n = entry.count if entry.count is not None else len(entry.gpus or ())
        ask = ask_of_entry(self.policy, entry.host, n, entry.slots, entry.job)
        where = pool.name if pool else ""
        refused = quota_refusal(self.policy, subjects, self._seen, where, ask, self._gone)
        if refused is None or refused.startswith("the quota counter"):
            return refused
        # Charges of assignments that vanished (a killed run's lease ran out) are
        # given back by the holder's own next take: they put no one over quota.
        listed = [c for c in charged_assignments(self._seen, subjects) if c not in self._looked]
        if listed:
            self._looked.update(listed)
            try:
                store, layout = self.allocator.store, self.allocator.layout
                self._gone.update(absent_charges(store, layout, listed))
            except PermissionDenied:  # a viewer who may not read them: counted as held
                pass
            refused = quota_refusal(self.policy, subjects, self._seen, where, ask, self._gone)
        return refused

    def over_quota(self, waiting: Waiting) -> bool:
        """Whether ``waiting`` is skipped by the turn rule as over quota."""
        return self.refusal(waiting) is not None

    def compares(self) -> list[Compare]:
        """Compares of every counter looked at: a skip holds only while they do not move."""
        layout = self.allocator.layout
        return [
            Compare(counter_key(layout, s), kv.mod_revision if kv is not None else 0)
            for s, kv in sorted(self._seen.items())
        ]


@dataclass(frozen=True, slots=True)
class QueueLine:
    """One waiting request as ``allocator queue`` shows it."""

    position: int
    host: str
    holder: str
    job: str
    requested: str
    since: str
    priority: int
    why: str
    entry: str
    fair_share: float | None = None  # the factor its entry stores (the policy's fair_share)
    usage: float | None = None  # the decayed GPU-hours it was computed from
    preemptible: bool = False  # ``--preemptible``: after every normal entry

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``fair_share`` and ``usage`` when its entry has them)."""
        found = {
            "position": self.position,
            "host": self.host,
            "holder": self.holder,
            "job": self.job,
            "requested": self.requested,
            "since": self.since,
            "priority": self.priority,
            "why": self.why,
            "entry": self.entry,
        }
        if self.fair_share is not None:
            found["fair_share"] = self.fair_share
        if self.usage is not None:
            found["usage"] = self.usage
        if self.preemptible:
            found["preemptible"] = True
        return found


def queue_lines(
    allocator: Context, now: datetime, host: str | None = None, listing: Listing | None = None
) -> list[QueueLine]:
    """Every waiting request (of ``host``, or of all hosts), in each host's order, with why.

    ``listing``: the queue (of :func:`queue_prefix`) already read; else it is read here.
    """
    layout = allocator.layout
    if listing is None:
        listing = allocator.store.list(queue_prefix(layout, host))
    by_host: dict[str, list[KeyValue]] = {}
    for item in listing.items:
        parts = item.key[len(layout.queue) :].split("/")
        if len(parts) == 2:
            by_host.setdefault(parts[0], []).append(item)
    snapshot = allocator.policy() if by_host else None
    lines: list[QueueLine] = []
    for name, items in sorted(by_host.items()):
        state = allocator.host(name)
        alive = state.agent is not None
        order = decode_queue(items, allocator.on_bad_record, agent_alive=alive)
        look = QuotaLook(allocator, snapshot.policy) if snapshot else None
        for position, waiting in enumerate(order, 1):
            why = _why(
                allocator, snapshot.policy if snapshot else None, state, order, waiting, look, now
            )
            entry = waiting.entry
            lines.append(
                QueueLine(
                    position,
                    name,
                    entry.holder,
                    entry.job,
                    entry.requested,
                    entry.since,
                    entry.priority,
                    why,
                    waiting.name,
                    entry.fair_share,
                    entry.usage,
                    entry.preemptible,
                )
            )
    return _as_gangs(lines)


#: What ``allocator queue`` says of a request whose turn it is on its host.
_ITS_TURN = "its turn: taking the GPUs"


def _as_gangs(lines: list[QueueLine]) -> list[QueueLine]:
    """A gang's line says its turn only where it is its turn on every host listed (pure).

    A job across hosts waits with one entry of the same name on each host
    and takes them all at once: on a host where it is its turn while another
    holds it up, its line names what holds it up there.
    """
    hosts: dict[str, list[QueueLine]] = {}
    for line in lines:
        hosts.setdefault(line.entry, []).append(line)
    held: dict[str, str] = {}
    for name, same in hosts.items():
        stuck = [line for line in same if line.why != _ITS_TURN]
        if len(same) > 1 and stuck:
            held[name] = f"its turn here; waits on {stuck[0].host}: {stuck[0].why}"
    told = [line.why == _ITS_TURN and line.entry in held for line in lines]
    return [replace(x, why=held[x.entry]) if t else x for x, t in zip(lines, told, strict=True)]


def remove_entry(allocator: Context, host: str, name: str) -> QueueLine:
    """Delete the queue entry ``name`` of ``host`` (a stuck one: no waiter will); what it was.

    ``NotFound`` when there is none. The delete compares the entry's
    revision, so it removes exactly what was read.
    """

    key = allocator.layout.queue_entry(host, name)
    found = allocator.store.get(key)
    if found is None:
        raise NotFound(f"no queue entry {name!r} on {host} (`allocator queue` lists them)")
    order = decode_queue([found], allocator.on_bad_record)
    allocator.store.txn([Compare(key, found.mod_revision)], [Delete(key)])
    entry = order[0].entry if order else None
    return QueueLine(
        0,
        host,
        entry.holder if entry else "",
        entry.job if entry else "",
        entry.requested if entry else "",
        entry.since if entry else "",
        entry.priority if entry else 0,
        "removed",
        name,
    )


def queue_prefix(layout: KeyLayout, host: str | None) -> str:
    """Where the queue of ``host`` (of every host: ``None``) is."""
    return layout.host_queue(host) if host else layout.queue


def _why(
    allocator: Context,
    policy: Policy | None,
    state: HostSnapshot,
    order: list[Waiting],
    waiting: Waiting,
    look: QuotaLook | None,
    now: datetime,
) -> str:
    if policy is None or look is None:
        return "no policy applied"
    if not waiting.leased and waiting.entry.submission:
        return f"submitted: {waiting.entry.host}'s agent is down; it runs the job once it is back"
    if not waiting.leased:
        return (
            f"no lease: no waiter keeps it (allocator queue remove host={waiting.entry.host} "
            f"entry={waiting.name})"
        )
    over = look.refusal(waiting)
    if over is not None:
        return over
    entry = waiting.entry
    try:
        placed = _place_entry(policy, state, entry, state.assignments, now)
    except AllocatorError as refused:
        return str(refused)
    if placed.mode == "cpu":
        return placed.fallback_reason or "no GPUs now"
    able = able_gpus(policy, state, now)
    fits = normal_fits(policy, state, now) if entry.preemptible else None
    ahead = blockers(order, waiting.key, placed.gpus, able, look.over_quota, normal_fits=fits)
    if ahead:
        first = ahead[0].entry
        return f"behind {first.job} ({first.holder}, {first.requested})"
    return _ITS_TURN


def _place_entry(
    policy: Policy,
    state: HostSnapshot,
    entry: QueueEntry,
    assignments: Mapping[str, Assignment],
    now: datetime,
) -> Placement:
    """Where ``entry``'s request lands among ``assignments`` (raises when it does not)."""
    from allocator.placement.choose import Request, place

    agent = state.agent
    request = Request(
        job=entry.job,
        host=entry.host,
        gpus=entry.gpus,
        count=entry.count,
        slots=entry.slots,
        asker=entry_asker(policy, entry),
        self_service=entry.self_service,
    )
    return place(
        policy,
        request,
        assignments,
        now,
        inventory=agent.gpus if agent and agent.gpus else None,
        unhealthy=agent.unhealthy if agent else None,
    )


def normal_fits(policy: Policy, state: HostSnapshot, now: datetime) -> Callable[[Waiting], bool]:
    """Whether a waiting normal request would fit on ``state``'s host, preemptible holdings gone.

    A preemptible waiter is held up only by such a request ahead
    (:func:`~allocator.recipes.queue.order.blockers`).
    """
    kept = {j: a for j, a in state.assignments.items() if not a.preemptible}

    def fits(waiting: Waiting) -> bool:
        try:
            placed = _place_entry(policy, state, waiting.entry, kept, now)
        except AllocatorError:
            return False
        return placed.mode == "gpu"

    return fits


def entry_asker(policy: Policy, entry: QueueEntry) -> tuple[str, ...]:
    """Who asks for ``entry`` as reservations see it (its holder's groups on this machine)."""

    if not any(r.who for r in policy.reservations):
        return ()
    groups = unix_groups(entry.holder) if needs_groups(policy) else ()
    return asker_of(policy, entry.holder, groups)


def able_gpus(policy: Policy, state: HostSnapshot, now: datetime) -> Able:
    """What each waiting request of ``state``'s host could be given now (its turn's "could use").

    A ``count=N`` request: the host's healthy GPUs not reserved for others,
    none when N is over its pool's per-job limit; a ``gpus=`` request: the
    GPUs not reserved for others (naming an unhealthy GPU is allowed).
    """
    from allocator.placement.choose import host_gpu_indices
    from allocator.placement.reservations import reserved_against

    agent = state.agent
    inventory = agent.gpus if agent and agent.gpus else None
    try:
        indices = frozenset(host_gpu_indices(policy, state.host, inventory))
    except AllocatorError:
        indices = frozenset()
    sick = frozenset(agent.unhealthy) if agent else frozenset()
    pool = policy.pool_of(state.host)
    limit = pool.max_gpus_per_job if pool is not None else None
    known: dict[tuple[str, bool, str, bool], frozenset[int]] = {}

    def able(entry: QueueEntry) -> frozenset[int]:
        by_count = entry.count is not None
        if by_count and limit is not None and (entry.count or 0) > limit:
            return frozenset()
        key = (entry.job, by_count, entry.holder, entry.self_service)
        cached = known.get(key)
        if cached is None:
            reserved = reserved_against(
                policy,
                state.host,
                entry.job,
                now,
                None,
                entry_asker(policy, entry),
                self_service=entry.self_service,
            )
            cached = indices - reserved.keys() - (sick if by_count else frozenset())
            known[key] = cached
        return cached

    return able
