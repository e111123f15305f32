"""The fleet's keys in memory, kept current from one watch: what ``allocator serve`` shows.

One prefix read fills it; the watch's events keep it current (a put
replaces a key, a delete removes it). Only what ``status`` reads is kept:
the hosts' keys and the applied policy, so history or the job index never
cost memory here; of the wait queue only its keys are counted, of the
agents' counts only their utilisation. A watch
event does not say whether its key is leased, and an agent's liveness is
its lease: the watcher looks the lease up for agent keys and passes it in.

Keys are kept host by host, and every change notes which hosts it touched
(:meth:`FleetMirror.take_changes`): what is built from the mirror is
rebuilt for those hosts only.

Every viewer's page and every API call is answered from here, never by
reading the store again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from allocator.errors import BadRecord, PolicyError
from allocator.policy import Policy
from allocator.records.keys import KeyLayout, split_host_key
from allocator.serve.utilisation import UtilisationTally
from allocator.status.summary import is_request
from allocator.store import Event, KeyValue, Listing, bad_key_records

if TYPE_CHECKING:
    from allocator.status.join import HostStatus

__all__ = ["FleetMirror"]


class FleetMirror:
    """The hosts' keys and the policy key, as of ``revision``; safe to share between threads."""

    def __init__(self, layout: KeyLayout) -> None:
        self.layout = layout
        # The layout's prefixes are properties that build their strings on every use.
        self._prefixes = (layout.hosts, layout.queue, layout.counts)
        self._counts_prefix = layout.counts
        self._hosts_prefix, self._queue_prefix, self._policy_key = (
            layout.hosts,
            layout.queue,
            layout.policy,
        )
        self._lock = threading.Lock()
        self._hosts: dict[str, dict[str, KeyValue]] = {}
        self._policy_item: KeyValue | None = None
        self._queued: set[str] = set()
        self._utilisation = UtilisationTally()
        self.revision = 0
        self.loaded = False  # read at least once
        self._policy: tuple[bytes, Policy | None] = (b"", None)
        self._bad_keys: tuple[BadRecord, ...] = ()  # the last read's keys that are not text
        self._changed_hosts: set[str] = set()
        self._changed_all = True  # a fresh read or a new policy: every host

    def keeps(self, key: str) -> bool:
        """Whether ``key`` is one the mirror holds (or, for the queue, counts)."""
        return key.startswith(self._prefixes) or key == self._policy_key

    @property
    def queued(self) -> int:
        """Requests waiting in the queue, as of ``revision``."""
        return len(self._queued)

    def utilisation_percent(self) -> float | None:
        """The fleet's mean GPU utilisation as its agents report it (``None``: none does)."""
        with self._lock:
            return self._utilisation.mean()

    def queued_keys(self) -> list[str]:
        """The keys of the requests waiting in the queue."""
        with self._lock:
            return list(self._queued)

    def reset(self, listing: Listing) -> None:
        """Replace everything with a fresh read."""
        hosts: dict[str, dict[str, KeyValue]] = {}
        queued: set[str] = set()
        utilisation = UtilisationTally()
        policy = None
        for item in listing.items:
            if item.key == self._policy_key:
                policy = item
            elif item.key.startswith(self._queue_prefix):
                if is_request(item.value):  # a damaged record waits for nothing
                    queued.add(item.key)
            elif item.key.startswith(self._counts_prefix):
                utilisation.put(item.key[len(self._counts_prefix) :], item.value)
            else:
                host = self._host_of(item.key)
                if host is not None:
                    hosts.setdefault(host, {})[item.key] = item
        with self._lock:
            self._hosts, self._policy_item, self._queued = hosts, policy, queued
            self._utilisation = utilisation
            self.revision, self.loaded = listing.revision, True
            self._bad_keys = bad_key_records(listing)
            self._changed_all, self._changed_hosts = True, set()

    def apply(self, events: Sequence[Event], leases: Mapping[str, int | None]) -> bool:
        """Apply a batch of watch events; return whether anything the mirror keeps changed.

        ``leases`` gives the current lease of put keys whose lease matters
        (agent keys); other keys keep the lease they had.
        """
        changed = False
        with self._lock:
            for event in events:
                self.revision = max(self.revision, event.revision)
                if self.keeps(event.key):
                    changed = self._apply(event, leases) or changed
        return changed

    def _apply(self, event: Event, leases: Mapping[str, int | None]) -> bool:
        """Apply one event; return whether the status shown changed (counts feed the series)."""
        gone = event.type == "delete" or event.value is None
        if event.key.startswith(self._queue_prefix):
            waiting = not gone and is_request(event.value)
            (self._queued.add if waiting else self._queued.discard)(event.key)
            return True
        if event.key.startswith(self._counts_prefix):
            reporter = event.key[len(self._counts_prefix) :]
            if gone or event.value is None:
                self._utilisation.remove(reporter)
            else:
                self._utilisation.put(reporter, event.value)
            return False
        if event.key == self._policy_key:
            old = self._policy_item
            self._policy_item = None if gone else _item(event, old, leases)
            self._changed_all = True
            return True
        host = self._host_of(event.key)
        if host is None:
            return True
        self._changed_hosts.add(host)
        keys = self._hosts.setdefault(host, {})
        if gone:
            keys.pop(event.key, None)
            if not keys:
                del self._hosts[host]
            return True
        keys[event.key] = _item(event, keys.get(event.key), leases)
        return True

    def _host_of(self, key: str) -> str | None:
        parsed = split_host_key(key, self._hosts_prefix)
        return parsed[0] if parsed is not None else None

    def take_changes(self) -> set[str] | None:
        """The hosts changed since the last call (``None``: all of them), forgotten."""
        with self._lock:
            hosts = None if self._changed_all else self._changed_hosts
            self._changed_all, self._changed_hosts = False, set()
        return hosts

    def host_items(self, host: str) -> list[KeyValue]:
        """Every key of ``host``, sorted."""
        with self._lock:
            keys = self._hosts.get(host, {})
            return [keys[key] for key in sorted(keys)]

    def host_names(self) -> set[str]:
        """The hosts that have keys."""
        with self._lock:
            return set(self._hosts)

    def assignment_items(self) -> list[KeyValue]:
        """Every assignment key (``hosts/<host>/jobs/<job>``), in no order.

        What usage counts: not the agents' records, most of a busy host's keys.
        """
        hosts = self._hosts_prefix
        found: list[KeyValue] = []
        with self._lock:
            for host, keys in self._hosts.items():
                jobs = f"{hosts}{host}/jobs/"  # once a host, not once a key
                found += [item for key, item in keys.items() if key.startswith(jobs)]
        return found

    def snapshot(self) -> tuple[list[KeyValue], KeyValue | None, int]:
        """The host items (sorted), the policy item, and the revision, consistently."""
        with self._lock:
            items = [item for keys in self._hosts.values() for item in keys.values()]
            policy, revision = self._policy_item, self.revision
        items.sort(key=_key)
        return items, policy, revision

    def policy_item(self) -> KeyValue | None:
        """The applied policy's key, if any."""
        return self._policy_item

    def bad_keys(self) -> tuple[BadRecord, ...]:
        """The last read's keys that are not text."""
        return self._bad_keys

    def policy(self, item: KeyValue | None, on_bad: Callable[[str], None]) -> Policy | None:
        """The applied policy (parsed once per version); ``None`` if absent or unreadable."""
        if item is None:
            return None
        raw, parsed = self._policy
        if item.value == raw:
            return parsed
        from allocator.policy import load_policy
        from allocator.records.codec import decode_record
        from allocator.records.types import PolicyRecord

        try:
            record = decode_record(item.value, PolicyRecord, item.key)
            parsed = load_policy(record.yaml, source="applied policy")
        except (BadRecord, PolicyError) as exc:
            on_bad(str(exc))
            parsed = None
        self._policy = (item.value, parsed)
        return parsed

    def status(self, now: datetime, on_bad: Callable[[str], None]) -> tuple[list[HostStatus], int]:
        """``build_status`` of the whole mirrored fleet at ``now``, and the revision it shows.

        Every host joined again: what the host-by-host view must equal.
        """
        from allocator.status.join import build_status

        items, policy_item, revision = self.snapshot()
        for bad in self._bad_keys:
            on_bad(str(bad))
        policy = self.policy(policy_item, on_bad)
        return build_status(policy, items, self.layout, now), revision


def _key(item: KeyValue) -> str:
    return item.key


def _item(event: Event, old: KeyValue | None, leases: Mapping[str, int | None]) -> KeyValue:
    assert event.value is not None
    return KeyValue(
        event.key,
        event.value,
        event.revision,
        old.create_revision if old is not None else event.revision,
        leases.get(event.key, old.lease if old is not None else None),
    )
