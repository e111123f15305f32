"""Records of the self-service write path: quota counters and wait-queue entries.

Both are written only by allocator clients in the same transaction as an
assignment (counters) or by a waiter under its own lease (entries), and read
back as strictly as every other record.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from allocator.records.codec import decode_record, encode_record
from allocator.records.fields import SCHEMA_VERSION, Count, GpuIndex, Name, Slots, Text

__all__ = ["HolderCount", "QueueEntry"]

_Pools = Annotated[dict[Text, Count], msgspec.Meta(max_length=1024)]


class HolderCount(msgspec.Struct, frozen=True):
    """What one quota subject (a user, team or unix group) holds now, per pool.

    ``gpus``: GPUs held whole; ``slots``: slots held of shared GPUs. The pool
    ``""`` is a host in no pool. Kept up to date by every assignment write
    that charges the subject, in the same transaction.
    """

    gpus: _Pools = msgspec.field(default_factory=dict)
    slots: _Pools = msgspec.field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> bytes:
        """Encode for the store."""
        return encode_record(self)

    @classmethod
    def from_json(cls, raw: bytes) -> HolderCount:
        """Decode a stored counter (``BadRecord`` if it is not one)."""
        return decode_record(raw, cls)


class QueueEntry(msgspec.Struct, frozen=True):
    """One request waiting for GPUs of ``host``: exactly one of ``gpus`` or ``count``.

    Ordered by ``priority`` (higher first), then by the store revision that
    created its key (first come, first served).
    """

    job: Name
    host: Name
    holder: Text
    since: Text
    gpus: Annotated[tuple[GpuIndex, ...], msgspec.Meta(max_length=1024)] | None = None
    count: Annotated[int, msgspec.Meta(ge=1, le=1024)] | None = None
    slots: Slots | None = None
    priority: Annotated[int, msgspec.Meta(ge=-1000, le=1000)] = 0
    requested: Text = ""
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if (self.gpus is None) == (self.count is None):
            raise ValueError("a queue entry asks for exactly one of gpus or count")

    def to_json(self) -> bytes:
        """Encode for the store."""
        return encode_record(self)

    @classmethod
    def from_json(cls, raw: bytes) -> QueueEntry:
        """Decode a stored entry (``BadRecord`` if it is not one)."""
        return decode_record(raw, cls)
