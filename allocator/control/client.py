"""Reading and writing assignments and the policy: the race-free core.

Every assignment write is one transaction that compares

* the policy key's revision (the policy the request was checked against),
* the host's generation key (bumped by every assignment change on the host), and
* the host's history head (the agent appends there too, changing no assignment),

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

import itertools
import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from allocator.control.actor import actor as default_actor
from allocator.errors import (
    BadRecord,
    CasConflict,
    ConflictError,
    RequestError,
)
from allocator.records.codec import replace_struct
from allocator.records.fields import SCHEMA_VERSION
from allocator.records.keys import DEFAULT_PREFIX, KeyLayout
from allocator.records.types import Assignment, RunHolder
from allocator.status.snapshots import (
    HostSnapshot,
    PolicySnapshot,
    job_not_found,
    snapshots_by_host,
)
from allocator.store import (
    MAX_TXN_OPS,
    Compare,
    Delete,
    Listing,
    Op,
    Put,
    Read,
    Store,
    TxnOutcome,
    bad_key_records,
    txn_size,
)
from allocator.util.identity import local_hostname
from allocator.util.times import format_time, utc_now

if TYPE_CHECKING:  # placement and the policy loader cost import time `get` need not pay
    from allocator.control.across_hosts import GroupResult
    from allocator.control.apply_policy import ApplyResult
    from allocator.control.write_cache import Planned, ViewCache, WriteView
    from allocator.placement.choose import Placement, Request
    from allocator.policy import Policy

    #: The wait queue's turn: (host state, placement) -> (compares, writes) to add.
    Gate = Callable[[HostSnapshot, Placement], tuple[list[Compare], list[Op]]]

__all__ = ["Allocator", "view_reads_for"]

DEFAULT_ATTEMPTS = 5
T = TypeVar("T")
#: What a ``set`` may carry besides the request: an ad-hoc command, the holding process.
_Extra = tuple[tuple[str, ...] | None, tuple[RunHolder, int] | None, "Gate | None"]


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
        holder: str | None = None,
    ) -> None:
        self.store = store
        self.on_bad_record = on_bad_record or (lambda _bad: None)
        self.layout = KeyLayout(prefix)
        self.clock = clock
        self.actor = actor or default_actor(store.url)
        self.attempts = attempts
        self._holder = holder
        self._groups: tuple[str, ...] | None = None
        self._cache: ViewCache | None = None  # what the last writes saw; made on first use

    # --- reads ------------------------------------------------------------

    def policy(self) -> PolicySnapshot | None:
        """The applied policy, or ``None`` if none was applied yet."""
        from allocator.control.write_cache import policy_snapshot

        return policy_snapshot(
            self.store, self.layout, self.store.get(self.layout.policy), self.on_bad_record
        )

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
        for bad in (*bad_key_records(listing), *snapshot.bad_records):
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
        from allocator.control.job_index import locate_job

        found = locate_job(self.store, self.layout, job, self.on_bad_record)
        return found.assignments, found.damaged

    @property
    def holder(self) -> str:
        """Who this client's assignments are held by (:mod:`allocator.control.holder`)."""
        if self._holder is None:
            from allocator.control.holder import holder_name

            self._holder = holder_name(self.store.url)
        return self._holder

    def holder_groups(self, policy: Policy) -> tuple[str, ...]:
        """The holder's unix groups, looked up only when ``policy`` names one."""
        from allocator.control.holder import needs_groups, unix_groups

        if not needs_groups(policy):
            return ()
        if self._groups is None:
            self._groups = unix_groups(self.holder)
        return self._groups

    # --- writes -----------------------------------------------------------

    def assign(
        self,
        request: Request,
        *,
        reason: str = "",
        command: tuple[str, ...] | None = None,
        held_by: tuple[RunHolder, int] | None = None,
        gate: Gate | None = None,
    ) -> tuple[Assignment, Placement]:
        """Check ``request`` against policy and current state, then write it atomically.

        ``request.host`` may be empty: the default host is used then.
        ``held_by`` (the holding process, a store lease): the assignment and its
        job index entry are written under that lease, so they disappear when the
        lease does (see :mod:`allocator.control.leased`); the job must hold nothing yet.
        ``gate`` (the wait queue's turn): called with the host's state and the
        placement decided; it returns what else the transaction compares and
        writes, or raises to refuse.
        """
        attempts = itertools.count()
        extra = (command, held_by, gate)
        return self._with_retries(
            lambda: self._assign_once(request, reason, extra, first=next(attempts) == 0), "set"
        )

    def release(
        self,
        host: str,
        job: str,
        *,
        reason: str = "",
        if_revision: int | None = None,
        ended: tuple[int, float] | None = None,
    ) -> Assignment | BadRecord:
        """Remove ``job``'s assignment on ``host``; return what was removed.

        A damaged assignment record is removed too (returned as the
        ``BadRecord`` that describes it): releasing is how an operator clears
        one. ``NotFound`` if the job holds nothing there. ``reason`` goes into
        the history entry written with the release. ``if_revision``: remove it only while the
        assignment key is still at that revision (a ``ConflictError`` if it
        was set again meanwhile), as the agent's idle release does. ``ended``
        (exit status, GPU-seconds): how the command that held it ended, for history.
        """
        return self._with_retries(
            lambda: self._release_once(host, job, reason, if_revision, ended), "release"
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

        Node ranks follow the order of ``hosts``; see :mod:`allocator.control.across_hosts`.
        """
        from allocator.control.across_hosts import check_hosts, plan_group_set

        nodes = check_hosts(request.job, hosts)

        def once() -> GroupResult:
            snapshot = self.require_policy()
            if command is not None:
                _check_adhoc_command(snapshot.policy, request.job)
            generation = self._generation_value()
            write = plan_group_set(self, snapshot, request, nodes, (reason, command), generation)
            self._views().clear()  # written without the kept views: they are stale now
            self._txn(write.compares, write.ops)
            return write.result

        return self._with_retries(once, "set")

    def release_across(
        self, job: str, *, reason: str = "", if_share: tuple[str, int] | None = None
    ) -> GroupResult:
        """Release ``job`` on every host where it holds anything, in one transaction.

        ``if_share`` (host, revision): release only while that host's share is
        still at that revision (a ``ConflictError`` if it was set again
        meanwhile), as the agent's idle release of a job across hosts does.
        """
        from allocator.control.across_hosts import plan_group_release

        def once() -> GroupResult:
            write = plan_group_release(self, job, self._generation_value(), reason)
            if if_share is not None:
                write.compares.append(
                    Compare(self.layout.assignment(if_share[0], job), if_share[1])
                )
            self._views().clear()
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
        from allocator.control.retries import with_retries

        return with_retries(operation, what, self.attempts)

    def _assign_once(
        self, asked: Request, reason: str, extra: _Extra, *, first: bool
    ) -> tuple[Assignment, Placement]:
        """One attempt: decided from the kept view if there is one, else from one fresh read.

        A view kept from earlier calls that turns out stale costs no attempt:
        its failed write brought back the fresh state, and the attempt goes
        again from that. A write decided from state read for this call (on a
        later attempt, what the lost race brought back) that loses is a lost race.
        """
        host = asked.host or self.default_host(self._known_policy())
        view = self._views().get(host, asked.job)
        fresh = view is None or not first
        if view is None:
            view = self._read_view(host, asked.job)
        while True:
            # replace() would validate the request again; it was when it was made.
            request = asked if asked.host == host else replace_struct(asked, host=host)
            try:
                placed, planned = self._plan_assign(view, request, reason, extra)
            except ConflictError:
                if fresh:
                    raise
                # A refusal decided from a kept view is only a guess too: the holder it
                # names may be gone (released by another client, or its lease expired).
                view, fresh = self._read_view(host, asked.job), True
                continue
            outcome = self._write(planned, view_reads_for(self.layout, host, asked.job))
            if outcome.succeeded:
                self._views().keep(planned.after(outcome.revision))
                return placed
            view = self._settle(host, asked.job, outcome)
            if fresh:
                raise CasConflict("a compared key changed", keys=outcome.changed)
            fresh = True

    def _plan_assign(
        self, view: WriteView, request: Request, reason: str, extra: _Extra
    ) -> tuple[tuple[Assignment, Placement], Planned]:
        from allocator.control.history_entries import change_entry
        from allocator.control.write_cache import plan_change
        from allocator.placement.choose import place

        command, held_by, gate = extra
        snapshot = view.policy or self._no_policy()
        if command is not None:
            _check_adhoc_command(snapshot.policy, request.job)
        state, now = view.host, self.clock()
        if held_by is not None and (request.job in state.assignments or view.index.hosts):
            raise ConflictError(
                f"job {request.job!r} already holds an assignment: "
                "`allocator run` takes GPUs for a job that holds none (pick another job=)"
            )
        agent = state.agent
        decision = place(
            snapshot.policy,
            request,
            state.assignments,
            now,
            inventory=agent.gpus if agent and agent.gpus else None,
            unhealthy=agent.unhealthy if agent else None,
        )
        from allocator.placement.request import describe_request

        stamp = format_time(now)
        assignment = Assignment(
            job=request.job,
            host=state.host,
            gpus=decision.gpus,
            mode=decision.mode,
            updated_by=self.actor,
            updated_at=stamp,
            reason=reason,
            requested=describe_request(request),
            policy_revision=snapshot.revision,
            command=command,
            fallback_reason=decision.fallback_reason,
            slots=decision.slots,
            exclusive=decision.exclusive,
            picked=decision.picked,
            run=held_by[0] if held_by is not None else None,
            holder=self.holder,
            charged=self.charged(snapshot.policy),
        )
        lease = held_by[1] if held_by is not None else None
        before = state.assignments.get(request.job)
        key = self.layout.assignment(state.host, request.job)
        planned = plan_change(
            self.layout,
            view,
            Put(key, assignment.to_json(), lease),
            change_entry(before, assignment, self.actor, stamp, reason),
            assignment,
            # The agent's record (inventory, health) was checked too: compare it.
            compares=[
                Compare(self.layout.policy, snapshot.revision),
                Compare(self.layout.agent(state.host), state.agent_revision),
            ],
            history=snapshot.policy.history,
            generation=self._generation_value(stamp),
            lease=lease,
        )
        more = self.charge(snapshot.policy, [before] if before else [], [assignment])
        if gate is not None:
            gated = gate(state, decision)
            more = (more[0] + gated[0], more[1] + gated[1])
        return (assignment, decision), _with_extra(planned, *more)

    def _release_once(
        self,
        host: str,
        job: str,
        reason: str,
        if_revision: int | None = None,
        ended: tuple[int, float] | None = None,
    ) -> Assignment | BadRecord:
        from allocator.control.history_entries import release_entry
        from allocator.control.write_cache import plan_change

        view = self._read_view(host, job)
        state = view.host
        key = self.layout.assignment(host, job)
        current: Assignment | BadRecord | None = state.assignments.get(job)
        if current is None:
            current = next((bad for bad in state.bad_records if bad.key == key), None)
        if current is None:
            raise job_not_found(job, host, list(state.assignments))
        compares = [] if if_revision is None else [Compare(key, if_revision)]
        held = current if isinstance(current, Assignment) else None
        stamp = format_time(self.clock())
        entry = release_entry(host, job, held, self.actor, stamp, reason, ended)
        planned = plan_change(
            self.layout,
            view,
            Delete(key),
            entry,
            None,
            compares=compares,
            generation=self._generation_value(stamp),
        )
        if held is not None and held.charged and view.policy is not None:
            planned = _with_extra(planned, *self.charge(view.policy.policy, [held], []))
        # A release is decided from fresh state, so a plain transaction: a lost
        # compare is a lost race, and the retry reads again.
        revision = self._txn(planned.compares, planned.ops)
        self._views().keep(planned.after(revision))
        return current

    # --- kept views ---------------------------------------------------------

    def forget_views(self) -> None:
        """Decide the next write from a fresh read (a waiter's state moved since its last try).

        A kept view is only checked by the write it leads to; a request
        refused from a stale one (GPUs held that were released since) never
        gets that far.
        """
        self._views().clear()

    def _views(self) -> ViewCache:
        if self._cache is None:
            from allocator.control.write_cache import ViewCache

            self._cache = ViewCache()
        return self._cache

    def _known_policy(self) -> Policy | None:
        kept = self._views().policy
        whole = kept is not None and kept.host is None  # not one host's share
        snapshot = kept if whole else self.policy()
        return snapshot.policy if snapshot is not None else None

    def _no_policy(self) -> PolicySnapshot:
        raise RequestError(
            f"no policy applied in {self.store.url}: run `allocator policy apply FILE` first"
        )

    def _read_view(self, host: str, job: str) -> WriteView:
        """The state a change of ``job`` on ``host`` is decided from: one request."""
        from allocator.control.write_cache import view_reads

        found = self.store.read_many(view_reads(self.layout, host, job, policy_text=True))
        return self._settled(host, job, found)

    def _settle(self, host: str, job: str, outcome: TxnOutcome) -> WriteView:
        return self._settled(host, job, outcome.reads)

    def _settled(self, host: str, job: str, found: Sequence[Listing]) -> WriteView:
        from allocator.control.write_cache import settle_view

        known = self._views().policy
        for listing in found:
            for bad in bad_key_records(listing):
                self.on_bad_record(bad)
        view = settle_view(self.store, self.layout, host, job, found, known, self.on_bad_record)
        self._views().keep(view)
        return view

    def _write(self, planned: Planned, reads: list[Read]) -> TxnOutcome:
        """``store.txn_or_read``, refusing anything larger than every backend accepts."""
        _check_size(planned.compares, planned.ops)
        return self.store.txn_or_read(planned.compares, planned.ops, reads)

    def _txn(self, compares: list[Compare], ops: list[Op]) -> int:
        """``store.txn``, refusing anything larger than every backend accepts."""
        _check_size(compares, ops)
        return self.store.txn(compares, ops)

    def _apply_once(
        self, policy: Policy, text: str, source: str, force: bool, reason: str
    ) -> ApplyResult:
        from allocator.control.apply_policy import apply_once

        return apply_once(self, policy, text, source, force, reason)

    def violations(self, policy: Policy) -> list[str]:
        """Current assignments that ``policy`` would refuse, one line each."""
        from allocator.control.apply_policy import violations

        return violations(self, policy)

    def charged(self, policy: Policy) -> tuple[str, ...]:
        from allocator.control.holder import quota_subjects

        if not policy.quotas:
            return ()
        return quota_subjects(policy, self.holder, self.holder_groups(policy))

    def charge(
        self, policy: Policy, before: Sequence[Assignment], after: Sequence[Assignment]
    ) -> tuple[list[Compare], list[Op]]:
        """The quota counters' compares and writes of replacing ``before`` with ``after``.

        Reads the counters of the subjects they charge (nothing when none
        does); raises ``OverQuota`` (exit 3) when a quota would be exceeded.
        """
        subjects = {s for a in (*before, *after) for s in a.charged}
        if not subjects:
            return [], []
        from allocator.control.quotas import OverQuota, heal_and_plan, plan_charge, read_counters

        counters = read_counters(self.store, self.layout, subjects)
        try:
            found = plan_charge(policy, self.layout, counters, before, after, self.on_bad_record)
        except OverQuota:  # maybe charges of assignments that vanished: drop them, try again
            found = heal_and_plan(self, policy, counters, before, after)
        return found.compares, found.ops

    def _generation_value(self, stamp: str | None = None) -> bytes:
        at = stamp if stamp is not None else format_time(self.clock())
        body = {"schema_version": SCHEMA_VERSION, "by": self.actor, "at": at}
        return json.dumps(body, sort_keys=True).encode()


def _with_extra(planned: Planned, compares: list[Compare], ops: list[Op]) -> Planned:
    """``planned`` with more compares and writes in the same transaction."""
    if not compares and not ops:
        return planned
    from allocator.control.write_cache import Planned

    return Planned([*planned.compares, *compares], [*planned.ops, *ops], planned.after)


def view_reads_for(layout: KeyLayout, host: str, job: str) -> list[Read]:
    """What a failed change brings back: the view's reads, the policy's revision only."""
    from allocator.control.write_cache import view_reads

    return view_reads(layout, host, job, policy_text=False)


def _check_size(compares: Sequence[Compare], ops: Sequence[Op]) -> None:
    size = txn_size(compares, ops)
    if size > MAX_TXN_OPS:  # a bug here, not the user's: say so plainly
        raise AssertionError(f"a transaction of {size} operations exceeds {MAX_TXN_OPS}")


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
