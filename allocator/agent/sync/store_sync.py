"""The agent's store sync, as one part of the agent: the link, and what the store last said.

The loop drains the link's messages (:meth:`StoreSync.drain`), then takes the
newest read (:meth:`StoreSync.take_view`): the policy (a bad one is refused
and the last good one kept), the assignments (a damaged record keeps its
last good assignment) and the other hosts of jobs across hosts. Until the
store is read, the assignments are those the last agent read intact.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Mapping
from typing import assert_never

from allocator.agent.config import AgentConfig
from allocator.agent.log import DecisionLog
from allocator.agent.planning.across_hosts import PeerHost
from allocator.agent.sync.host_records import HostView
from allocator.agent.sync.last_good import load_last_good, save_last_good
from allocator.agent.sync.messages import LinkState, ToLoop
from allocator.agent.sync.policy_read import SharedPolicy
from allocator.agent.sync.run_expiry import vanished_runs
from allocator.agent.sync.store_thread import StoreLink
from allocator.errors import BadRecord, PolicyError
from allocator.policy import Policy, load_policy
from allocator.policy.shares import assemble, shares_agree
from allocator.records.types import Assignment, PolicyRecord
from allocator.store import Store

__all__ = ["StoreSync"]


class StoreSync:
    """The store link, its inbox, and the policy and assignments the agent goes by."""

    def __init__(
        self,
        config: AgentConfig,
        url: str,
        log: DecisionLog,
        *,
        open_store: Callable[[str], Store],
        clock: Callable[[], float],
    ) -> None:
        self._log = log
        self.inbox: queue.Queue[ToLoop] = queue.Queue()
        self.link = StoreLink(config, url, log, self.inbox, open_store=open_store, clock=clock)
        self.connected = False
        self.pending: HostView | None = None  # the newest read, not taken yet
        self.policy: Policy | None = None
        self.policy_sha = ""
        self.host_named = True  # the policy in force names this host (else nothing runs)
        self._refused_sha = ""
        self._pending = ""  # shares seen not to agree yet (logged once)
        self._host = config.host
        self._said_no_policy = False
        # Until the store is read: what the last agent read intact (used only for
        # jobs whose record the store then holds damaged).
        self._last_good_path = config.agent_dir / "assignments.json"
        self.assignments, self.revisions = load_last_good(self._last_good_path, config.host)
        self.peers: Mapping[str, PeerHost] = {}  # the other hosts of jobs across hosts
        self.have_state = False  # a policy and a read of the store: reconciling can begin
        # The assignments come from a read of the current connection: a run-held one
        # gone from the next read vanished just now (see run_expiry), not at some
        # unknown time while the agent was down or cut off.
        self._read_on_this_link = False
        self.vanished_runs: list[tuple[Assignment, int]] = []
        self.last_good_due = False

    def drain(self, timeout: float) -> LinkState | None:
        """Wait up to ``timeout`` for messages; keep the newest read; return the newest state."""
        try:
            messages = [self.inbox.get(timeout=timeout)]
        except queue.Empty:
            return None
        while True:
            try:
                messages.append(self.inbox.get_nowait())
            except queue.Empty:
                break
        state: LinkState | None = None
        for message in messages:
            match message:
                case LinkState():
                    state = message
                    self.connected = message.connected
                    self._read_on_this_link = self._read_on_this_link and message.connected
                case HostView():  # level-based: only the newest read matters
                    self.pending = message
                case _:
                    assert_never(message)
        return state

    def take_view(self, on_policy: Callable[[Policy], None]) -> None:
        """Adopt the newest read as the state to reconcile towards.

        ``on_policy`` is called with a new policy once it is in force, before it is logged.
        """
        view = self.pending
        assert view is not None
        if view.policy is not None:
            self._use_policy(view.policy, on_policy)
        elif self.policy is None and not self._said_no_policy:
            self._said_no_policy = True
            self._log("no-policy", {"hint": "run `allocator policy apply FILE`"})
        assignments, revisions = dict(view.assignments), dict(view.revisions)
        for job in view.damaged & self.assignments.keys():  # keep its last good assignment
            assignments[job] = self.assignments[job]
            revisions[job] = self.revisions[job]
        if (assignments, revisions) != (self.assignments, self.revisions):
            self.last_good_due = True  # saved after the reconcile: off the path of a move
        if self._read_on_this_link:
            self.vanished_runs = vanished_runs(self.assignments, self.revisions, assignments)
        self._read_on_this_link = True
        self.assignments, self.revisions = assignments, revisions
        self.peers = view.peers
        self.have_state = self.policy is not None
        self.pending = None

    def _use_policy(
        self, record: PolicyRecord | SharedPolicy, on_policy: Callable[[Policy], None]
    ) -> None:
        if isinstance(record, SharedPolicy):
            self._use_shares(record, on_policy)
            return
        if record.sha256 in (self.policy_sha, self._refused_sha):
            return
        try:
            policy = load_policy(record.yaml, source="applied policy")
        except PolicyError as exc:  # keep the last good policy rather than stopping work
            self._refused_sha = record.sha256
            self._log("bad-policy", {"sha256": record.sha256[:12], "error": str(exc)})
            return
        self.policy, self.policy_sha = policy, record.sha256
        self._name_host(policy.names_host(self._host))
        on_policy(policy)
        self._log("policy", {"sha256": record.sha256[:12], "applied_by": record.applied_by})

    def _use_shares(self, shared: SharedPolicy, on_policy: Callable[[Policy], None]) -> None:
        """Adopt the host's share of the policy once it agrees with the common share."""
        identity = shared.identity
        if identity in (self.policy_sha, self._refused_sha):
            return
        host = shared.host
        if not shares_agree(shared.common, shared.common_revision, host, shared.host_revision):
            if self._pending != identity:  # an apply still writing: keep the last good policy
                self._pending = identity
                fields = {"common": shared.common.policy_sha256[:12]}
                host_sha = host.policy_sha256[:12] if host else ""
                self._log("policy-pending", {**fields, "host": host_sha})
            return
        try:
            policy = assemble(shared.common_policy, shared.part, self._host)
        except BadRecord as exc:  # keep the last good policy rather than stopping work
            self._refused_sha = identity
            self._log("bad-policy", {"sha256": identity[:12], "error": str(exc)})
            return
        self.policy, self.policy_sha, self._pending = policy, identity, ""
        self._name_host(shared.host_named)
        on_policy(policy)
        self._log("policy", {"sha256": shared.digest[:12], "share": identity[:12]})

    def _name_host(self, named: bool) -> None:
        """Take whether the policy now in force names this host; say so when it stops."""
        if self.host_named and not named:
            hint = "its jobs stop; `allocator release` frees their assignments"
            self._log("host-not-in-policy", {"host": self._host, "hint": hint})
        self.host_named = named

    def save_last_good(self) -> None:
        """Save the assignments, for a restart while the store holds a record damaged."""
        self.last_good_due = False
        try:
            save_last_good(self._last_good_path, self.assignments, self.revisions)
        except OSError as exc:  # only a restart during a damaged record would miss it
            self._log("state-write-failed", {"path": str(self._last_good_path), "error": str(exc)})

    def known_assignments(self) -> Mapping[str, Assignment] | None:
        """The assignments once the store was read with a policy, else None (not known yet)."""
        return self.assignments if self.have_state else None
