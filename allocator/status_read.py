"""What ``allocator status`` reads: the applied policy and every host's records, at one revision.

One batch reads the policy record and its compiled form; the hosts' records
are then read at that batch's revision, on a second thread while this one
decodes the policy and loads the modules that join and print. On etcd's
JSON gateway the hosts are read as several key ranges at once
(:meth:`~allocator.store.etcd_http.EtcdHttpStore.list_at`), cut between the
policy's hosts: etcd marshals a fleet's 10 MB answer on one core per
request, and that was most of what status waited for. Where the compiled
form is missing the hosts are read in one range, as on every other store.

Policy, assignments, agents and workers then come from one snapshot (the
policy used to be read a moment before the hosts).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from allocator.errors import BadRecord, Compacted, InvalidName
from allocator.keys import KeyLayout
from allocator.store import KeyValue, Listing, Read

__all__ = ["HOSTS_PER_PART", "MAX_PARTS", "host_names", "read_status", "split_points"]

#: At most this many ranges read at once: etcd marshals each on its own core.
MAX_PARTS = 4
#: No part smaller than this many hosts (~14 keys each): a small fleet is one range.
HOSTS_PER_PART = 100


class _PolicyHosts(msgspec.Struct):
    hosts: dict[str, msgspec.Raw] = msgspec.field(default_factory=dict)


class _CompiledHosts(msgspec.Struct):
    policy: _PolicyHosts = msgspec.field(default_factory=_PolicyHosts)


_COMPILED_HOSTS = msgspec.json.Decoder(_CompiledHosts)


def host_names(compiled: bytes) -> list[str]:
    """The host names a compiled policy record declares; ``[]`` if it does not read as one.

    Only where to cut the read depends on them (never what is read), so the
    record is not checked here: it is decoded strictly with the policy.
    """
    try:
        return list(_COMPILED_HOSTS.decode(compiled).policy.hosts)
    except msgspec.MsgspecError:
        return []


def split_points(
    layout: KeyLayout,
    hosts: Iterable[str],
    max_parts: int = MAX_PARTS,
    per_part: int = HOSTS_PER_PART,
) -> list[str]:
    """Keys to cut the hosts' prefix at: parts of about as many hosts each.

    Invalid names are left out (a cut is only ever a hint).
    """
    names = sorted(h for h in hosts if _valid_host(layout, h))
    parts = min(max_parts, len(names) // max(1, per_part))
    return [layout.host(names[len(names) * i // parts]) for i in range(1, parts)]


def _valid_host(layout: KeyLayout, host: str) -> bool:
    try:
        layout.host(host)
    except InvalidName:
        return False
    return True


def read_status(
    allocator: Any, prefix: str, *, whole_fleet: bool, while_reading: Callable[[], None]
) -> tuple[Any, Listing]:
    """The applied policy (``None``: none, or unreadable) and every key under ``prefix``.

    ``whole_fleet``: ``prefix`` is every host's (the read may be cut
    between hosts). ``while_reading`` runs on this thread while the hosts
    are read. A damaged policy record is reported and status goes on
    without a policy: status is what an operator reads to find out what is
    wrong, so it must not be the command that stops working when something is.
    """
    layout: KeyLayout = allocator.layout
    store = allocator.store
    policy_read, compiled_read = store.read_many(
        [Read(layout.policy), Read(layout.compiled_policy)]
    )
    compiled = _first(compiled_read)
    splits = split_points(layout, host_names(compiled.value)) if whole_fleet and compiled else []
    reader = _ListingReader(store, prefix, policy_read.revision, splits)
    reader.start()
    try:
        while_reading()
        policy = _policy(allocator, _first(policy_read), compiled_read)
    finally:
        reader.join()
    return policy, reader.result()


def _first(listing: Listing) -> KeyValue | None:
    return listing.items[0] if listing.items else None


def _policy(allocator: Any, item: KeyValue | None, compiled: Listing) -> Any:
    from allocator.policy.compiled import applied_policy
    from allocator.records import PolicyRecord, decode_record

    if item is None:
        return None
    try:
        record = decode_record(item.value, PolicyRecord, item.key)
    except BadRecord as exc:
        allocator.on_bad_record(exc)
        return None
    return applied_policy(
        allocator.store, allocator.layout, record, allocator.on_bad_record, compiled
    )


class _ListingReader(threading.Thread):
    """Reads the hosts' keys; what it raised is raised again by :meth:`result`."""

    def __init__(self, store: Any, prefix: str, revision: int, splits: list[str]) -> None:
        super().__init__(name="status-listing", daemon=True)
        self._store, self._prefix, self._revision, self._splits = store, prefix, revision, splits
        self._listing: Listing | None = None
        self._error: BaseException | None = None

    def run(self) -> None:
        try:
            self._listing = self._read()
        except BaseException as exc:  # raised again on the caller's thread
            self._error = exc

    def _read(self) -> Listing:
        list_at = getattr(self._store, "list_at", None)
        if list_at is None or not self._splits:
            return self._store.list(self._prefix)  # type: ignore[no-any-return]
        try:
            return list_at(self._prefix, self._revision, self._splits)  # type: ignore[no-any-return]
        except Compacted:  # the policy's revision is gone already: one range of the present
            return self._store.list(self._prefix)  # type: ignore[no-any-return]

    def result(self) -> Listing:
        """The listing read, or what reading it raised."""
        if self._error is not None:
            raise self._error
        assert self._listing is not None
        return self._listing
