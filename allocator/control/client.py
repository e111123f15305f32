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

This module is the client's state (its kept views, its holder) and its
operations; one attempt of each lives beside it: ``set`` and ``release`` of
a job on one host in :mod:`allocator.control.one_host`, of a job across
hosts in :mod:`allocator.control.across_hosts`, ``policy apply`` in
:mod:`allocator.control.apply.policy`. Each attempt takes this client as
the few calls :mod:`allocator.control.writer` names, not as an ``Allocator``,
so none of them imports this module back.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from allocator.control.actor import actor as default_actor
from allocator.errors import BadRecord
from allocator.records.codec import replace_struct
from allocator.records.keys import DEFAULT_PREFIX, KeyLayout
from allocator.records.types import Assignment, RunHolder
from allocator.status.snapshots import HostSnapshot, PolicySnapshot, no_policy_error, read_host
from allocator.store import MAX_TXN_OPS, Compare, Op, Read, Store, TxnOutcome, txn_size
from allocator.util.identity import local_hostname
from allocator.util.times import format_time, utc_now

if TYPE_CHECKING:  # placement and the policy loader cost import time `get` need not pay
    from allocator.control.across_hosts import GroupResult
    from allocator.control.apply.policy import ApplyResult
    from allocator.control.gate import Gate
    from allocator.control.owners import Standing
    from allocator.control.write_cache import Planned, ViewCache
    from allocator.placement.choose import Placement, Request
    from allocator.policy import Policy

__all__ = ["Allocator"]

DEFAULT_ATTEMPTS = 5
T = TypeVar("T")


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
        acts_for_policy: bool = False,
    ) -> None:
        self.store = store
        self.on_bad_record = on_bad_record or (lambda _bad: None)
        self.layout = KeyLayout(prefix)
        self.clock = clock
        self.actor = actor or default_actor(store.url)
        self.attempts = attempts
        self._holder = holder
        # The host agent's idle release enforces the reviewed policy, whoever holds.
        self.acts_for_policy = acts_for_policy
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
            raise no_policy_error(self.store.url)
        return snapshot

    def host(self, host: str) -> HostSnapshot:
        """Everything stored under ``host``, in one prefix read."""
        return read_host(self.store, self.layout, host, self.on_bad_record)

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
        lease does (see :mod:`allocator.recipes.holding`); the job must hold nothing yet.
        ``gate`` (the wait queue's turn): called with the host's state and the
        placement decided; it returns what else the transaction compares and
        writes, or raises to refuse.
        """
        from allocator.control.one_host import assign_once

        attempts = itertools.count()
        extra = (command, held_by, gate)

        def attempt() -> tuple[Assignment, Placement]:
            first = next(attempts) == 0
            return assign_once(self, self._on_host(request), reason, extra, first=first)

        return self._with_retries(attempt, "set")

    def _on_host(self, request: Request) -> Request:
        """``request`` on the host it names, else on the default host."""
        host = request.host or self.default_host(self.known_policy())
        # replace() would validate the request again; it was when it was made.
        return request if request.host == host else replace_struct(request, host=host)

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
        from allocator.control.one_host import release_once

        return self._with_retries(
            lambda: release_once(self, host, job, reason, (if_revision, ended)), "release"
        )

    def assign_across(
        self,
        request: Request,
        hosts: Sequence[str],
        *,
        reason: str = "",
        command: tuple[str, ...] | None = None,
        gate: Gate | None = None,
    ) -> GroupResult:
        """Assign ``request`` on every one of ``hosts`` as one job: one transaction, all or none.

        Node ranks follow the order of ``hosts``; see :mod:`allocator.control.across_hosts`.
        ``gate`` (a gang's turn in the wait queues) is asked on every host, as in :meth:`assign`.
        """
        from allocator.control.across_hosts import check_hosts, plan_group_set
        from allocator.control.planner import check_adhoc_command

        nodes = check_hosts(request.job, hosts)

        def once() -> GroupResult:
            snapshot = self.require_policy()
            if command is not None:
                check_adhoc_command(snapshot.policy, request.job)
            generation = self._generation()
            why = (reason, command)
            write = plan_group_set(self, snapshot, request, nodes, why, generation, gate)
            self.kept_views().clear()  # written without the kept views: they are stale now
            self.txn(write.compares, write.ops)
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
            write = plan_group_release(self, job, self._generation(), reason)
            if if_share is not None:
                write.compares.append(
                    Compare(self.layout.assignment(if_share[0], job), if_share[1])
                )
            self.kept_views().clear()
            self.txn(write.compares, write.ops)
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

    # --- kept views ---------------------------------------------------------

    def forget_views(self) -> None:
        """Decide the next write from a fresh read (a waiter's state moved since its last try).

        A kept view is only checked by the write it leads to; a request
        refused from a stale one (GPUs held that were released since) never
        gets that far.
        """
        self.kept_views().clear()

    def kept_views(self) -> ViewCache:
        """What the last writes saw (:mod:`allocator.control.write_cache`)."""
        if self._cache is None:
            from allocator.control.write_cache import ViewCache

            self._cache = ViewCache()
        return self._cache

    def known_policy(self) -> Policy | None:
        """The kept whole policy, else the applied one read now."""
        kept = self.kept_views().policy
        whole = kept is not None and kept.host is None  # not one host's share
        snapshot = kept if whole else self.policy()
        return snapshot.policy if snapshot is not None else None

    # --- transactions -------------------------------------------------------

    def write(self, planned: Planned, reads: list[Read]) -> TxnOutcome:
        """``store.txn_or_read``, refusing anything larger than every backend accepts."""
        _check_size(planned.compares, planned.ops)
        return self.store.txn_or_read(planned.compares, planned.ops, reads)

    def txn(self, compares: list[Compare], ops: list[Op]) -> int:
        """``store.txn``, refusing anything larger than every backend accepts."""
        _check_size(compares, ops)
        return self.store.txn(compares, ops)

    # --- policy and quotas --------------------------------------------------

    def _apply_once(
        self, policy: Policy, text: str, source: str, force: bool, reason: str
    ) -> ApplyResult:
        from allocator.control.apply.policy import apply_once

        return apply_once(self, policy, text, source, force, reason)

    def violations(self, policy: Policy) -> list[str]:
        """Current assignments that ``policy`` would refuse, one line each."""
        from allocator.control.apply.policy import violations

        return violations(self, policy)

    def standing(self, policy: Policy | None) -> Standing:
        """The holder's standing under ``policy`` (none: the empty one), for a write's checks."""
        from allocator.control.holder import quota_subjects
        from allocator.control.owners import Standing
        from allocator.policy.model import Policy

        rules = policy if policy is not None else Policy(version=1)
        groups = self.holder_groups(rules)
        charged = quota_subjects(rules, self.holder, groups) if rules.quotas else ()
        return Standing(self.holder, self.acts_for_policy, groups, charged, rules)

    def _generation(self) -> bytes:
        """The value a write made now puts in the generation keys it bumps."""
        from allocator.control.write_cache import generation_value

        return generation_value(self.actor, format_time(self.clock()))


def _check_size(compares: Sequence[Compare], ops: Sequence[Op]) -> None:
    size = txn_size(compares, ops)
    if size > MAX_TXN_OPS:  # a bug here, not the user's: say so plainly
        raise AssertionError(f"a transaction of {size} operations exceeds {MAX_TXN_OPS}")
