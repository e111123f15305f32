"""The agent's read of the policy: its share of it, fetched only when a revision moved.

Each read of the host asks, in the same request, for the revisions (keys
only) of the common share, the host's share, the shares' head and the whole
policy record; a
value is fetched, and decoded, only when its ``mod_revision`` differs from
the one read last. So the periodic resync of an unchanged policy costs one
small request, whatever the fleet's size.

While the store holds no shares (a policy applied by an older version), or
the policy record is newer than the shares' head (applied since by a user
who may not write the shares), the agent reads the whole policy record, as
it always did. The agent does not watch the head or the policy record for
this: its periodic resync notices.

A host without a share of its own is not in the applied policy (its jobs
stop), unless no host has one: a policy that names no host at all. Only a
host without a share makes one more read, of one key's name under the
hosts' shares; a role that may not list them takes the missing share as
the host's removal (which a policy naming hosts is far likelier to mean).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from allocator.errors import BadRecord, PermissionDenied
from allocator.policy.model import Policy
from allocator.policy.shares import HostPart, decode_common, decode_host_part
from allocator.records.codec import decode_record
from allocator.records.keys import KeyLayout
from allocator.records.shares import PolicyShare, SharesHead
from allocator.records.types import PolicyRecord
from allocator.store import KeyValue, Listing, Read, Store

__all__ = ["PolicyRead", "PolicyReader", "SharedPolicy"]


@dataclass(frozen=True, slots=True)
class SharedPolicy:
    """The agent's share of the policy, decoded: the common share and its host's (if any)."""

    common: PolicyShare
    common_policy: Policy
    common_revision: int
    host: PolicyShare | None = None
    part: HostPart | None = None
    host_revision: int = 0
    host_named: bool = True  # false: other hosts have shares, this one none
    applied_sha256: str = ""  # the applied policy's, as the shares' head names it

    @property
    def digest(self) -> str:
        """The applied policy's digest (the common share's own, which an apply that
        left it unchanged does not update, only while the head names none)."""
        return self.applied_sha256 or self.common.policy_sha256

    @property
    def identity(self) -> str:
        """Names this pair of shares (the agent's key for "the policy changed")."""
        mine = self.host.sha256 if self.host else "-" if self.host_named else "unnamed"
        return f"{self.common.sha256}:{mine}"


@dataclass(frozen=True, slots=True)
class PolicyRead:
    """What one read found: the whole policy record, or the shares, or nothing usable."""

    policy: PolicyRecord | SharedPolicy | None = None
    present: bool = False
    bad: tuple[tuple[BadRecord, int], ...] = ()
    whole: bool = False  # no shares are stored: the whole record was read


_Decoded = PolicyRecord | tuple[PolicyShare, Policy] | tuple[PolicyShare, HostPart] | None


class PolicyReader:
    """Reads the host's keys and its share of the policy, keeping what did not change."""

    def __init__(self, layout: KeyLayout, host: str) -> None:
        self._layout = layout
        self._host = host
        self._keys = (
            layout.common_share,
            layout.host_share(host),
            layout.policy,
            layout.shares_head,
        )
        # key -> (mod_revision, decoded value or the BadRecord it raised)
        self._cache: dict[str, tuple[int, _Decoded | BadRecord]] = {}

    def read(self, store: Store) -> tuple[Listing, PolicyRead]:
        """One request for the host's keys and the policy's revisions, then what moved."""
        reads = [Read(self._layout.host(self._host), prefix=True)]
        # The head's value is a digest (tens of bytes): the policy in force, to log.
        reads += [Read(key, values=key == self._layout.shares_head) for key in self._keys]
        try:
            listing, *heads = store.read_many(reads)
        except PermissionDenied:  # a role granted before there were shares: as it always read
            listing = store.list(self._layout.host(self._host))
            return listing, self._whole(store, store.get(self._layout.policy), fetched=True)
        common, host, whole, head = (h.items[0] if h.items else None for h in heads)
        if common is None or head is None or (whole and whole.mod_revision > head.mod_revision):
            # No shares, or a policy applied since without them (a user who may
            # not write them, an older version): the whole record.
            return listing, self._whole(store, whole)
        shared = self._shared(store, common, host)
        if shared is None:
            return listing, self._whole(store, whole)
        if isinstance(shared.policy, SharedPolicy):
            applied = replace(shared.policy, applied_sha256=_head_digest(head))
            shared = replace(shared, policy=applied)
        return listing, shared

    def _whole(self, store: Store, head: KeyValue | None, *, fetched: bool = False) -> PolicyRead:
        if head is None:
            return PolicyRead(whole=True)
        found = self._decoded(store, head, head if fetched else None)
        if isinstance(found, BadRecord):
            return PolicyRead(present=True, bad=((found, head.mod_revision),), whole=True)
        record = found if isinstance(found, PolicyRecord) else None
        return PolicyRead(record, present=record is not None, whole=True)

    def _shared(self, store: Store, common: KeyValue, host: KeyValue | None) -> PolicyRead | None:
        """The shares read; ``None`` when another version wrote them (the whole record then)."""
        found = self._decoded(store, common)
        host_found = self._decoded(store, host) if host is not None else None
        bad = tuple(
            (value, item.mod_revision)
            for item, value in ((common, found), (host, host_found))
            if isinstance(value, BadRecord) and item is not None
        )
        if bad:
            return PolicyRead(present=True, bad=bad)
        if not isinstance(found, tuple) or not isinstance(found[1], Policy):
            return None
        if host is None:
            named = not self._other_hosts_named(store)
            shared = SharedPolicy(found[0], found[1], common.mod_revision, host_named=named)
            return PolicyRead(shared, present=True)
        if not isinstance(host_found, tuple) or not isinstance(host_found[1], HostPart):
            return None
        shared = SharedPolicy(
            found[0], found[1], common.mod_revision, host_found[0], host_found[1], host.mod_revision
        )
        return PolicyRead(shared, present=True)

    def _other_hosts_named(self, store: Store) -> bool:
        """Whether any host has a share (one key's name read): the policy names hosts."""
        try:
            (found,) = store.read_many(
                [Read(self._layout.host_shares, prefix=True, values=False, limit=1)]
            )
        except PermissionDenied:
            return True
        return bool(found.items)

    def _decoded(
        self, store: Store, head: KeyValue, item: KeyValue | None = None
    ) -> _Decoded | BadRecord:
        """The value at ``head.key`` decoded; read (unless ``item`` is it) only when it moved."""
        cached = self._cache.get(head.key)
        if cached is not None and cached[0] == head.mod_revision:
            return cached[1]
        item = item if item is not None else store.get(head.key)
        if item is None:  # deleted since the revisions were read: the next read sees it
            self._cache.pop(head.key, None)
            return None
        try:
            value: _Decoded | BadRecord = self._decode(item)
        except BadRecord as exc:
            value = exc
        self._cache[item.key] = (item.mod_revision, value)
        return value

    def _decode(self, item: KeyValue) -> _Decoded:
        if item.key == self._layout.policy:
            return decode_record(item.value, PolicyRecord, item.key)
        if item.key == self._layout.common_share:
            return decode_common(item.value, item.key)
        return decode_host_part(item.value, item.key, self._host)


def _head_digest(head: KeyValue) -> str:
    """The policy the shares' head names; ``""`` while an apply writes them, or unreadable."""
    try:
        return decode_record(head.value, SharesHead, head.key).policy_sha256
    except BadRecord:  # the shares are read all the same; only the log loses its digest
        return ""
