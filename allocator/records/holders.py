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

__all__ = ["Charge", "HolderCount", "QueueEntry"]


class Charge(msgspec.Struct, frozen=True):
    """What one assignment counts against a subject: its pool, GPUs held whole, slots."""

    pool: Text = ""
    gpus: Count = 0
    slots: Count = 0


class HolderCount(msgspec.Struct, frozen=True):
    """What one quota subject (a user, team or unix group) holds now.

    ``charges``: per assignment (``host/job``), what it counts. The totals
    are their sums; each assignment is listed so that one whose key vanished
    without a release (its lease expired) can be found and dropped by the
    next write that needs the room. The pool ``""`` is a host in no pool.
    """

    charges: Annotated[dict[Text, Charge], msgspec.Meta(max_length=100_000)] = msgspec.field(
        default_factory=dict
    )
    schema_version: int = SCHEMA_VERSION

    def totals(self) -> tuple[dict[str, int], dict[str, int]]:
        """(GPUs, slots) held per pool."""
        gpus: dict[str, int] = {}
        slots: dict[str, int] = {}
        for charge in self.charges.values():
            gpus[charge.pool] = gpus.get(charge.pool, 0) + charge.gpus
            slots[charge.pool] = slots.get(charge.pool, 0) + charge.slots
        return {p: n for p, n in gpus.items() if n}, {p: n for p, n in slots.items() if n}

    def to_json(self) -> bytes:
        """Encode for the store."""
        return encode_record(self)

    @classmethod
    def from_json(cls, raw: bytes) -> HolderCount:
        """Decode a stored counter (``BadRecord`` if it is not one)."""
        return decode_record(raw, cls)


class QueueEntry(msgspec.Struct, frozen=True):
    """One request waiting for GPUs of ``host``: exactly one of ``gpus`` or ``count``.

    Ordered by ``priority`` (higher first), then by ``fair_share`` (higher
    first; set when the policy has ``fair_share``, else 1), then by the store
    revision that created its key (first come, first served). ``usage``: the
    decayed GPU-hours the factor was computed from.
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
    self_service: bool = False  # run / lease(): reservations and priorities bind to the holder
    fair_share: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    usage: Annotated[float, msgspec.Meta(ge=0.0)] | None = None
    #: A submitted batch job's record (``<user>/<job>`` under the submissions prefix):
    #: it has no waiting process, the host's agent takes its turn and runs it.
    submission: Text = ""
    #: ``--preemptible``: it sorts after every other entry, and what it takes a
    #: normal request takes back (:mod:`allocator.recipes.queue.order`).
    preemptible: bool = False
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
