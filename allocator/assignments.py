"""Reading and writing assignments and the policy: the race-free core.

Every assignment write is one transaction that compares

* the policy key's revision (the policy the request was checked against), and
* the host's generation key (bumped by every assignment change on the host),

and bumps the fleet's generation key too, so two operators racing for one
GPU can never both win: the loser's transaction fails, it re-reads, and
placement then refuses it naming the winner. ``policy apply`` compares the
policy's revision and the fleet generation it checked the assignments at,
so an assignment made during its check makes it re-check instead of
landing over it. A lost race is retried a bounded number of times
(tenacity). Every transaction stays within ``MAX_TXN_OPS``, the smallest
limit of any backend.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from allocator.errors import (
    BadRecord,
    CasConflict,
    ConflictError,
    NotFound,
    PlacementRefused,
    RequestError,
)
from allocator.identity import actor as default_actor
from allocator.identity import format_time, local_hostname, utc_now
from allocator.keys import DEFAULT_PREFIX, KeyLayout
from allocator.records import (
    SCHEMA_VERSION,
    AgentRecord,
    Assignment,
    HistoryEntry,
    PolicyRecord,
    WorkerRecord,
    decode_record,
    replace_struct,
)
from allocator.store import MAX_TXN_OPS, Compare, Delete, KeyValue, Op, Put, Store, txn_size

if TYPE_CHECKING:  # placement and the policy loader cost import time `get` need not pay
    from allocator.groups import GroupResult
    from allocator.placement import Placement, Request
    from allocator.policy import Policy

__all__ = [
    "Allocator",
    "ApplyResult",
    "HostSnapshot",
    "PolicySnapshot",
    "job_not_found",
    "snapshots_by_host",
]

DEFAULT_ATTEMPTS = 5
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PolicySnapshot:
    """The applied policy, its record, and the revision it was read at."""

    policy: Policy
    record: PolicyRecord
    revision: int


@dataclass(frozen=True, slots=True)
class HostSnapshot:
    """Everything stored under one host, read in one prefix read."""

    host: str
    assignments: dict[str, Assignment] = field(default_factory=dict)
    generation: int = 0
    agent: AgentRecord | None = None
    workers: dict[str, WorkerRecord] = field(default_factory=dict)
    revision: int = 0
    bad_records: tuple[BadRecord, ...] = ()


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What ``policy apply`` did."""

    changed: bool
    record: PolicyRecord
    revision: int
    warnings: tuple[str, ...] = ()
    compiled: bool = True  # the compiled form was stored too (see allocator.policy.compiled)


def snapshots_by_host(
    items: Sequence[KeyValue], layout: KeyLayout, revision: int
) -> dict[str, HostSnapshot]:
    """Decode keys read under the hosts prefix into one :class:`HostSnapshot` per host.

    One pass over ``items``: ``status`` on a fleet reads every host at once.
    A record that does not decode, or whose body disagrees with its key, is
    left out and listed in its host's ``bad_records``; it never hides the
    rest of the host, let alone other hosts.
    """
    parts: dict[str, dict[str, Any]] = {}
    for item in items:
        parsed = layout.parse_host_key(item.key)
        if parsed is None:
            continue
        host, kind, name = parsed
        part = parts.setdefault(
            host,
            {"assignments": {}, "workers": {}, "generation": 0, "agent": None, "bad_records": ()},
        )
        try:
            _add_host_item(part, item, host, kind, name)
        except BadRecord as exc:
            part["bad_records"] = (*part["bad_records"], exc)
    return {host: HostSnapshot(host, revision=revision, **part) for host, part in parts.items()}


def job_not_found(job: str, host: str | None, held_there: Sequence[str] = ()) -> NotFound:
    """The one "not found" answer of every command that looks a job up (exit 6).

    ``host`` ``None`` means every host was searched; ``held_there`` names
    the jobs that host does hold, to catch a typo.
    """
    where = f"on host {host!r}" if host else "on any host"
    others = f" (jobs there: {', '.join(sorted(held_there))})" if held_there else ""
    return NotFound(f"job {job!r} holds nothing {where}{others}")


def _add_host_item(part: dict[str, Any], item: KeyValue, host: str, kind: str, name: str) -> None:
    if kind == "jobs" and name:
        part["assignments"][name] = decode_record(
            item.value, Assignment, item.key, job=name, host=host
        )
    elif kind == "workers" and name:
        part["workers"][name] = decode_record(
            item.value, WorkerRecord, item.key, job=name, host=host
        )
    elif kind == "generation":
        part["generation"] = item.mod_revision
    elif kind == "agent":
        part["agent"] = decode_record(item.value, AgentRecord, item.key, host=host)


class Allocator:
    """Operations on one store: read state, assign, release, apply policy."""

    def __init__(
        self,
        store: Store,
        *,
        prefix: str = DEFAULT_PREFIX,
        clock: Callable[[], datetime] = utc_now,
        actor: str | None = None,
        attempts: int = DEFAULT_ATTEMPTS,
        on_bad_record: Callable[[BadRecord], None] | None = None,
    ) -> None:
        self.store = store
        self.on_bad_record = on_bad_record or (lambda _bad: None)
        self.layout = KeyLayout(prefix)
        self.clock = clock
        self.actor = actor or default_actor(store.url)
        self.attempts = attempts

    # --- reads ------------------------------------------------------------

    def policy(self) -> PolicySnapshot | None:
        """The applied policy, or ``None`` if none was applied yet."""
        item = self.store.get(self.layout.policy)
        if item is None:
            return None
        from allocator.policy.compiled import applied_policy

        record = decode_record(item.value, PolicyRecord, item.key)
        policy = applied_policy(self.store, self.layout, record, self.on_bad_record)
        return PolicySnapshot(policy, record, item.mod_revision)

    def require_policy(self) -> PolicySnapshot:
        """The applied policy, or a ``RequestError`` telling how to apply one."""
        snapshot = self.policy()
        if snapshot is None:
            raise RequestError(
                f"no policy applied in {self.store.url}: run `allocator policy apply FILE` first"
            )
        return snapshot

    def host(self, host: str) -> HostSnapshot:
        """Everything stored under ``host``, in one prefix read."""
        listing = self.store.list(self.layout.host(host))
        found = snapshots_by_host(listing.items, self.layout, listing.revision)
        snapshot = found.get(host, HostSnapshot(host, revision=listing.revision))
        for bad in snapshot.bad_records:
            self.on_bad_record(bad)
        return snapshot

    def default_host(self, policy: Policy | None) -> str:
        """The only host in the policy, else this machine's host name."""
        if policy is not None and len(policy.hosts) == 1:
            return next(iter(policy.hosts))
        return local_hostname()

    def find_job(self, job: str) -> list[Assignment]:
        """Every host's assignment of ``job``, found through the job index.

        A bad record of the job is skipped and reported to ``on_bad_record``.
        """
        return self.locate_job(job)[0]

    def locate_job(self, job: str) -> tuple[list[Assignment], list[str]]:
        """``job``'s assignments, and the hosts where its record is damaged.

        Reads the job's index key and the job's own keys; only a store without
        an index entry for the job is scanned host by host (one prefix read).
        """
        from allocator.jobindex import locate_job

        found = locate_job(self.store, self.layout, job, self.on_bad_record)
        return found.assignments, found.damaged

    # --- writes -----------------------------------------------------------

    def assign(
        self, request: Request, *, reason: str = "", command: tuple[str, ...] | None = None
    ) -> tuple[Assignment, Placement]:
        """Check ``request`` against policy and current state, then write it atomically.

        ``request.host`` may be empty: the default host is used then.
        """
        return self._with_retries(lambda: self._assign_once(request, reason, command), "set")

    def release(
        self, host: str, job: str, *, reason: str = "", if_revision: int | None = None
    ) -> Assignment | BadRecord:
        """Remove ``job``'s assignment on ``host``; return what was removed.

        A damaged assignment record is removed too (returned as the
        ``BadRecord`` that describes it): releasing is how an operator clears
        one. ``NotFound`` if the job holds nothing there. ``reason`` goes into
        the history entry written with the release. ``if_revision``: remove it only while the
        assignment key is still at that revision (a ``ConflictError`` if it
        was set again meanwhile), as the agent's idle release does.
        """
        return self._with_retries(
            lambda: self._release_once(host, job, reason, if_revision), "release"
        )

    def assign_across(
        self,
        request: Request,
        hosts: Sequence[str],
        *,
        reason: str = "",
        command: tuple[str, ...] | None = None,
    ) -> GroupResult:
        """Assign ``request`` on every one of ``hosts`` as one job: one transaction, all or none.

        Node ranks follow the order of ``hosts``; see :mod:`allocator.groups`.
        """
        from allocator.groups import check_hosts, plan_group_set

        nodes = check_hosts(request.job, hosts)

        def once() -> GroupResult:
            snapshot = self.require_policy()
            if command is not None:
                _check_adhoc_command(snapshot.policy, request.job)
            generation = self._generation_value()
            write = plan_group_set(self, snapshot, request, nodes, (reason, command), generation)
            self._txn(write.compares, write.ops)
            return write.result

        return self._with_retries(once, "set")

    def release_across(self, job: str, *, reason: str = "") -> GroupResult:
        """Release ``job`` on every host where it holds anything, in one transaction."""
        from allocator.groups import plan_group_release

        def once() -> GroupResult:
            write = plan_group_release(self, job, self._generation_value(), reason)
            self._txn(write.compares, write.ops)
            return write.result

        return self._with_retries(once, "release")

    def apply_policy(
        self, text: str, source: str, *, force: bool = False, reason: str = ""
    ) -> ApplyResult:
        """Validate ``text`` and store it as the applied policy (CAS on the old one).

        Existing assignments the new policy would forbid are refused (exit 3,
        each named) unless ``force``. ``reason`` goes into the policy's history.
        """
        from allocator.policy import load_policy

        policy = load_policy(text, source=source)
        return self._with_retries(
            lambda: self._apply_once(policy, text, source, force, reason), "policy apply"
        )

    # --- internals ----------------------------------------------------------

    def _with_retries(self, operation: Callable[[], T], what: str) -> T:
        # The first attempt needs no retry machinery: tenacity (and what it loads,
        # a tenth of a one-shot command's start-up) is imported only after a lost race.
        try:
            return operation()
        except CasConflict as exc:
            lost = [exc]

        def attempt() -> T:
            if lost:  # the first attempt, already made: tenacity waits, then retries
                raise lost.pop()
            return operation()

        from tenacity import (
            Retrying,
            retry_if_exception_type,
            stop_after_attempt,
            wait_random_exponential,
        )

        retrying = Retrying(
            retry=retry_if_exception_type(CasConflict),
            stop=stop_after_attempt(self.attempts),
            wait=wait_random_exponential(multiplier=0.01, max=0.2),
            reraise=True,
        )
        try:
            return retrying(attempt)
        except CasConflict as exc:
            raise ConflictError(
                f"{what}: the store changed under us {self.attempts} times in a row "
                f"({', '.join(exc.keys) or 'compared keys'}); nothing was written, try again"
            ) from exc

    def _assign_once(
        self, asked: Request, reason: str, command: tuple[str, ...] | None
    ) -> tuple[Assignment, Placement]:
        from allocator.history import change_entry
        from allocator.placement import place

        snapshot = self.require_policy()
        if command is not None:
            _check_adhoc_command(snapshot.policy, asked.job)
        host = asked.host or self.default_host(snapshot.policy)
        state = self.host(host)
        agent = state.agent
        request = replace_struct(asked, host=host)
        decision = place(
            snapshot.policy,
            request,
            state.assignments,
            self.clock(),
            inventory=agent.gpus if agent and agent.gpus else None,
            unhealthy=agent.unhealthy if agent else None,
        )
        assignment = Assignment(
            job=request.job,
            host=host,
            gpus=decision.gpus,
            mode=decision.mode,
            updated_by=self.actor,
            updated_at=format_time(self.clock()),
            reason=reason,
            requested=describe_request(request),
            policy_revision=snapshot.revision,
            command=command,
            fallback_reason=decision.fallback_reason,
            slots=decision.slots,
            exclusive=decision.exclusive,
            picked=decision.picked,
        )
        before = state.assignments.get(request.job)
        self._assignment_txn(
            host,
            request.job,
            [
                Compare(self.layout.policy, snapshot.revision),
                Compare(self.layout.host_generation(host), state.generation),
            ],
            Put(self.layout.assignment(host, request.job), assignment.to_json()),
            change_entry(before, assignment, self.actor, assignment.updated_at, reason),
            snapshot.policy.history.entries_per_host,
        )
        return assignment, decision

    def _release_once(
        self, host: str, job: str, reason: str, if_revision: int | None = None
    ) -> Assignment | BadRecord:
        from allocator.history import release_entry

        state = self.host(host)
        key = self.layout.assignment(host, job)
        current: Assignment | BadRecord | None = state.assignments.get(job)
        if current is None:
            current = next((bad for bad in state.bad_records if bad.key == key), None)
        if current is None:
            raise job_not_found(job, host, list(state.assignments))
        compares = [Compare(self.layout.host_generation(host), state.generation)]
        if if_revision is not None:
            compares.append(Compare(key, if_revision))
        held = current if isinstance(current, Assignment) else None
        entry = release_entry(host, job, held, self.actor, format_time(self.clock()), reason)
        self._assignment_txn(host, job, compares, Delete(key), entry)
        return current

    def _assignment_txn(
        self,
        host: str,
        job: str,
        compares: list[Compare],
        change: Op,
        entry: HistoryEntry,
        history_limit: int | None = None,
    ) -> int:
        """Write one assignment change with the job's index and its history entry.

        Bumps the host's and the fleet's generations. The index and the host's
        history head are read here, just before the write, and compared in it:
        a concurrent change of the same job on another host, or another entry
        in this host's history, makes this retry. ``history_limit`` ``None``
        keeps the limit the host's history was last written with.
        """
        from allocator.history import host_stream, prepare_append
        from allocator.jobindex import index_change, index_for_write

        index = index_for_write(self.store, self.layout, job, self.on_bad_record)
        index_compare, index_op = index_change(
            self.layout, index, host, holds=isinstance(change, Put)
        )
        stream = host_stream(self.layout, host)
        head_compare, history_ops = prepare_append(
            self.store, stream, entry, history_limit, self.on_bad_record
        )
        ops = [
            change,
            Put(self.layout.host_generation(host), self._generation_value()),
            Put(self.layout.fleet_generation, self._generation_value()),
            index_op,
            *history_ops,
        ]
        return self._txn([*compares, index_compare, head_compare], ops)

    def _txn(self, compares: list[Compare], ops: list[Op]) -> int:
        """``store.txn``, refusing anything larger than every backend accepts."""
        size = txn_size(compares, ops)
        if size > MAX_TXN_OPS:  # a bug here, not the user's: say so plainly
            raise AssertionError(f"a transaction of {size} operations exceeds {MAX_TXN_OPS}")
        return self.store.txn(compares, ops)

    def _apply_once(
        self, policy: Policy, text: str, source: str, force: bool, reason: str
    ) -> ApplyResult:
        from allocator.history import policy_entry, policy_stream, prepare_append
        from allocator.policy import policy_sha256
        from allocator.policy.compiled import compiled_op, refresh_compiled, write_with_compiled

        current = self.store.get(self.layout.policy)
        digest = policy_sha256(text)
        old: PolicyRecord | None = None
        if current is not None:
            try:
                old = decode_record(current.value, PolicyRecord, current.key)
            except BadRecord as exc:  # a damaged record is what apply is there to replace
                self.on_bad_record(exc)
            else:
                if old.sha256 == digest:
                    revision = current.mod_revision
                    fresh = refresh_compiled(
                        self.store, self.layout, policy, current.value, digest, revision
                    )
                    return ApplyResult(False, old, revision, compiled=fresh)
        # Read before the assignments are checked: any assignment change after this
        # read moves it, and the compare below then sends apply round to check again.
        fleet = self.store.get(self.layout.fleet_generation)
        violations = self.violations(policy)
        if violations and not force:
            raise PlacementRefused(
                f"the new policy conflicts with {len(violations)} current assignment(s): "
                f"{violations[0]}"
                + (f" (and {len(violations) - 1} more)" if len(violations) > 1 else "")
                + "; release them first or use --force"
            )
        record = PolicyRecord(
            yaml=text,
            sha256=digest,
            applied_by=self.actor,
            applied_at=format_time(self.clock()),
            source=source,
        )
        compares = [
            Compare(self.layout.policy, current.mod_revision if current is not None else 0),
            Compare(self.layout.fleet_generation, fleet.mod_revision if fleet is not None else 0),
        ]
        entry = policy_entry(record, old, reason, len(violations))
        head_compare, history_ops = prepare_append(
            self.store,
            policy_stream(self.layout),
            entry,
            policy.history.entries_per_host,
            self.on_bad_record,
        )
        stored = record.to_json()
        compiled = compiled_op(self.layout, policy, digest, len(stored))
        revision, with_compiled = write_with_compiled(
            self._txn,
            [*compares, head_compare],
            [Put(self.layout.policy, stored), *history_ops],
            compiled,
        )
        return ApplyResult(True, record, revision, tuple(violations), compiled=with_compiled)

    def violations(self, policy: Policy) -> list[str]:
        """Current assignments that ``policy`` would refuse, one line each."""
        from allocator.placement import Request, place

        listing = self.store.list(self.layout.hosts)
        found: list[str] = []
        now = self.clock()
        for host, state in sorted(snapshots_by_host(listing.items, self.layout, 0).items()):
            inventory = state.agent.gpus if state.agent and state.agent.gpus else None
            for job, held in sorted(state.assignments.items()):
                if held.mode == "cpu":
                    continue
                others = {j: a for j, a in state.assignments.items() if j != job}
                slots = held.slots if held.slots > 1 else None
                request = Request(job=job, host=host, gpus=held.gpus, slots=slots)
                try:
                    place(policy, request, others, now, inventory=inventory)
                except (PlacementRefused, RequestError) as exc:
                    found.append(f"{job}@{host}: {exc}")
        return found

    def _generation_value(self) -> bytes:
        body = {"schema_version": SCHEMA_VERSION, "by": self.actor, "at": format_time(self.clock())}
        return json.dumps(body, sort_keys=True).encode()


def _check_adhoc_command(policy: Policy, job: str) -> None:
    """An ad-hoc command runs only where the reviewed policy allows it for that job."""
    spec = policy.jobs.get(job)
    if spec is None:
        raise RequestError(
            f"job {job!r} is not declared in the policy, so it cannot be given a command="
        )
    if not spec.allow_adhoc_command:
        raise RequestError(
            f"the policy does not allow ad-hoc commands for job {job!r} "
            "(set allow_adhoc_command: true on the job to permit command=)"
        )


def describe_request(request: Request) -> str:
    """The request as the operator typed it: ``gpus=1,3``, ``count=2 slots=2`` or ``gpus=cpu``."""
    return "gpus=cpu" if request.cpu else request.describe()
