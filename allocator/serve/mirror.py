"""The fleet's keys in memory, kept current from one watch: what ``allocator serve`` shows.

One prefix read fills it; the watch's events keep it current (a put
replaces a key, a delete removes it). Only what ``status`` reads is kept:
the hosts' keys and the applied policy, so history or the job index never
cost memory here. A watch event does not say whether its key is leased, and
an agent's liveness is its lease: the watcher looks the lease up for agent
keys and passes it in.

Every viewer's page and every API call is answered from here, never by
reading the store again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from allocator.errors import BadRecord, PolicyError
from allocator.policy import Policy
from allocator.records.keys import KeyLayout
from allocator.store import Event, KeyValue, Listing, bad_key_records

__all__ = ["FleetMirror"]


class FleetMirror:
    """The hosts' keys and the policy key, as of ``revision``; safe to share between threads."""

    def __init__(self, layout: KeyLayout) -> None:
        self.layout = layout
        self._lock = threading.Lock()
        self._items: dict[str, KeyValue] = {}
        self.revision = 0
        self.loaded = False  # read at least once
        self._policy: tuple[bytes, Policy | None] = (b"", None)
        self._bad_keys: tuple[BadRecord, ...] = ()  # the last read's keys that are not text

    def keeps(self, key: str) -> bool:
        """Whether ``key`` is one the mirror holds."""
        return key.startswith(self.layout.hosts) or key == self.layout.policy

    def reset(self, listing: Listing) -> None:
        """Replace everything with a fresh read."""
        items = {item.key: item for item in listing.items if self.keeps(item.key)}
        with self._lock:
            self._items, self.revision, self.loaded = items, listing.revision, True
            self._bad_keys = bad_key_records(listing)

    def apply(self, events: Sequence[Event], leases: Mapping[str, int | None]) -> bool:
        """Apply a batch of watch events; return whether anything the mirror keeps changed.

        ``leases`` gives the current lease of put keys whose lease matters
        (agent keys); other keys keep the lease they had.
        """
        changed = False
        with self._lock:
            for event in events:
                self.revision = max(self.revision, event.revision)
                if not self.keeps(event.key):
                    continue
                changed = True
                if event.type == "delete" or event.value is None:
                    self._items.pop(event.key, None)
                    continue
                old = self._items.get(event.key)
                self._items[event.key] = KeyValue(
                    event.key,
                    event.value,
                    event.revision,
                    old.create_revision if old is not None else event.revision,
                    leases.get(event.key, old.lease if old is not None else None),
                )
        return changed

    def snapshot(self) -> tuple[list[KeyValue], KeyValue | None, int]:
        """The host items (sorted), the policy item, and the revision, consistently."""
        with self._lock:
            items = [self._items[key] for key in sorted(self._items)]
            revision = self.revision
        policy = next((item for item in items if item.key == self.layout.policy), None)
        return [i for i in items if i.key != self.layout.policy], policy, revision

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

    def status(self, now: datetime, on_bad: Callable[[str], None]) -> tuple[list[Any], int]:
        """``build_status`` of the mirrored fleet at ``now``, and the revision it shows."""
        from allocator.status.join import build_status

        items, policy_item, revision = self.snapshot()
        for bad in self._bad_keys:
            on_bad(str(bad))
        policy = self.policy(policy_item, on_bad)
        return build_status(policy, items, self.layout, now), revision
