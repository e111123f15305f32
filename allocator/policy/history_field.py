"""The ``history:`` section, and the size check that keeps history within the store's quota.

```yaml
history:
  max_age: 30d            # entries older than this go with the next append
  entries_per_host: 80    # omit it: the most that fit max_bytes, up to 1,000
  max_bytes: 512MiB       # what all history may take (a quarter of etcd's 2 GiB)
```

History keys are live keys: compacting etcd frees none of them, and a store
past its quota refuses every write, assignments included. So a policy whose
history could outgrow ``max_bytes`` is refused: ``entries_per_host`` times
the streams (every host's and the policy's) times :data:`ENTRY_BYTES` (an
entry and its pointer in the fleet's index).
Written out, ``entries_per_host`` is checked; left out, it is the most that
fits (:func:`default_entries`), so a 10-host lab keeps 1,000 entries a host
and a 12,500-host fleet 67, with no policy refused for a default.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import msgspec

from allocator.policy.idle_rule import Duration
from allocator.policy.model import HistorySettings
from allocator.policy.yamlspec.kinds import Int, Scalar
from allocator.policy.yamlspec.reader import Reader
from allocator.policy.yamlspec.structures import Field, Record

if TYPE_CHECKING:
    from yaml.nodes import Node

__all__ = [
    "ENTRY_BYTES",
    "HISTORY",
    "MAX_HISTORY_ENTRIES",
    "STORE_QUOTA_BYTES",
    "ByteSize",
    "check_history_size",
    "default_entries",
    "history_bytes",
    "size_text",
]

#: What one history entry takes in the store, key and revision bookkeeping included (measured).
STORED_ENTRY_BYTES = 480
#: Its pointer in the fleet's index of recent entries (an ~80-byte key, no value, and the
#: same bookkeeping): the index holds about two hours of appends, counted as one an entry.
POINTER_BYTES = 160
#: An entry and its pointer: what the size check counts for each entry kept.
ENTRY_BYTES = STORED_ENTRY_BYTES + POINTER_BYTES
#: etcd's default backend quota (``--quota-backend-bytes``): past it etcd refuses every write.
STORE_QUOTA_BYTES = 2 * 1024**3
#: History entries kept per host: beyond this, reading one host's history is slow.
MAX_HISTORY_ENTRIES = 100_000
#: The entries a stream keeps when the fleet is small enough for them all.
USUAL_ENTRIES = 1000
MIN_AGE_SECONDS = 3600.0
MAX_AGE_SECONDS = 3650 * 86_400.0
MIN_BYTES = 1024**2
#: etcd's own suggested ceiling for ``--quota-backend-bytes``.
MAX_BYTES = 8 * 1024**3

_UNITS = {"": 1, "B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "KB": 1000}
_UNITS |= {"MB": 1000**2, "GB": 1000**3}
_SIZE = re.compile(r"(\d{1,12})\s*(B|KiB|MiB|GiB|KB|MB|GB)?", re.ASCII)
SIZE_PATTERN = r"^[0-9]{1,12} ?(B|KiB|MiB|GiB|KB|MB|GB)?$"


class ByteSize(Scalar):
    """A size in bytes: a whole number, or one with a unit (``512MiB``, ``1GiB``, ``800MB``)."""

    expected = "a size like 512MiB or 1GiB"
    value_kinds = frozenset({"number"})

    def __init__(self, *, minimum: int, maximum: int) -> None:
        self.minimum = minimum
        self.maximum = maximum

    def problem(self, value: Any, node: Node) -> str | None:
        """Refuse anything but a size within the bounds."""
        size = _bytes(value)
        if size is None:
            return f"expected a size like 512MiB, 1GiB or 800MB, got {describe(value)}"
        if not self.minimum <= size <= self.maximum:
            low, high = size_text(self.minimum), size_text(self.maximum)
            return f"must be from {low} to {high}, got {value}"
        return None

    def convert(self, value: Any) -> int:
        """Return the bytes."""
        size = _bytes(value)
        assert size is not None  # problem() refused it otherwise
        return size

    def schema(self) -> dict[str, Any]:
        """A whole number of bytes, or text with a unit."""
        return {
            "oneOf": [
                {"type": "integer", "minimum": self.minimum, "maximum": self.maximum},
                {"type": "string", "pattern": SIZE_PATTERN},
            ]
        }

    def dump(self, value: Any) -> Any:
        """Bytes back to text where a binary unit says it exactly (``536870912`` -> ``512MiB``)."""
        for unit in ("GiB", "MiB", "KiB"):
            if value % _UNITS[unit] == 0:
                return f"{value // _UNITS[unit]}{unit}"
        return value


def describe(value: Any) -> str:
    """``value`` as the message shows it."""
    shown = str(value)
    return repr(shown if len(shown) <= 40 else shown[:37] + "...")


def _bytes(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    match = _SIZE.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None:
        return None
    return int(match[1]) * _UNITS[match[2] or ""]


def size_text(size: float) -> str:
    """``536870912`` -> ``512 MiB``; ``6e9`` -> ``5.6 GiB``."""
    for unit in ("GiB", "MiB", "KiB"):
        if size >= _UNITS[unit]:
            amount = size / _UNITS[unit]
            return f"{amount:.0f} {unit}" if amount == int(amount) else f"{amount:.1f} {unit}"
    return f"{size:.0f} B"


HISTORY = Record(
    HistorySettings,
    (
        Field(
            "max_age",
            Duration(minimum=MIN_AGE_SECONDS, maximum=MAX_AGE_SECONDS),
            "Entries older than this (like 30d) are dropped by the stream's next append; "
            "`allocator history prune` drops them from streams nobody writes to any more "
            "(hosts that left the policy). Unset: entries go only when the count drops them.",
            attr="max_age_seconds",
        ),
        Field(
            "entries_per_host",
            Int(
                minimum=1,
                maximum=MAX_HISTORY_ENTRIES,
                why=f"more than {MAX_HISTORY_ENTRIES:,} entries make a host's history slow to read",
            ),
            "History entries kept per host (and for the policy); each new entry beyond it "
            "drops the oldest. Unset: the most that fit max_bytes, up to 1,000 (1,000 up to "
            "about 830 hosts, 67 at 12,500). Set: refused when it does not fit max_bytes.",
        ),
        Field(
            "max_bytes",
            ByteSize(minimum=MIN_BYTES, maximum=MAX_BYTES),
            "What all history may take in the store, entries_per_host x (hosts + 1) x ~640 B "
            "(default 512MiB: a quarter of etcd's default 2 GiB quota, leaving the rest to "
            "assignments, the policy and the revisions etcd keeps until it compacts). Raise "
            "it only with etcd's --quota-backend-bytes.",
        ),
    ),
    description="Assignment history (`allocator history`).",
)


def history_bytes(entries_per_host: int, streams: int) -> int:
    """What ``streams`` streams of ``entries_per_host`` entries take in the store, at most."""
    return entries_per_host * streams * ENTRY_BYTES


def default_entries(streams: int, max_bytes: int) -> int:
    """The most entries (up to 1,000) each of ``streams`` streams can keep within ``max_bytes``."""
    return min(USUAL_ENTRIES, max_bytes // (streams * ENTRY_BYTES))


def check_history_size(values: dict[str, Any], r: Reader) -> None:
    """Fill a left-out ``entries_per_host``; refuse history that could outgrow ``max_bytes``."""
    settings = values.get("history", HistorySettings())
    streams = len(values.get("hosts", {})) + 1  # every host's, and the policy's
    fits = default_entries(streams, settings.max_bytes)
    if "history.entries_per_host" not in r.lines:
        if fits >= 1:
            values["history"] = msgspec.structs.replace(settings, entries_per_host=fits)
            return
    elif history_bytes(settings.entries_per_host, streams) <= settings.max_bytes:
        return
    r.error_on("history.entries_per_host", _too_big(settings, streams, fits))


def _too_big(settings: HistorySettings, streams: int, fits: int) -> str:
    size = history_bytes(settings.entries_per_host, streams)
    cap = size_text(settings.max_bytes)
    if fits < 1:
        return (
            f"history.max_bytes {cap} cannot hold one entry (~{ENTRY_BYTES} B) for each of "
            f"{streams:,} streams ({streams - 1:,} hosts and the policy): raise history.max_bytes"
        )
    return (
        f"{settings.entries_per_host:,} entries x {streams:,} streams ({streams - 1:,} hosts and "
        f"the policy) x ~{ENTRY_BYTES} B = {size_text(size)}, more than history.max_bytes "
        f"({cap}; etcd refuses every write past its quota, 2 GiB by default): "
        f"set history.entries_per_host: {fits} (or leave it out for that default), and "
        "history.max_age to drop old entries sooner"
    )
