"""One host's GPU counts, as its agent last saw them: what ``status --summary`` adds up.

A fleet's summary used to read every host's records (14 keys a host, 175,000
at 12,500 hosts) to count five numbers per host. Each agent now writes those
numbers, under its lease, to ``counts/<host>`` whenever they change, so the
summary reads one small key per host. The counts are the agent's view of its
assignments (at most a watch event behind the store); a host with no such
record (its agent down, older, or refused the key) is counted from its own
records, as before. Reservations and pools are not in the record: they come
from the policy the summary reads. The record also carries the host's mean
GPU utilisation, which ``allocator serve`` plots.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from allocator.records.codec import decode_record, encode_record
from allocator.records.fields import SCHEMA_VERSION, Count, GpuIndex, Name

__all__ = ["HostCounts"]


class HostCounts(msgspec.Struct, frozen=True):
    """``host``'s GPUs (the indices counted) and how many of them are in each state.

    The states are :mod:`allocator.status.summary_count`'s: ``unhealthy``
    counts held GPUs too, ``free`` only healthy unheld ones, ``idle`` and
    ``fallback`` are among the held (``fallback`` also counts jobs the
    fallback rule put on CPU without GPUs).
    """

    host: Name
    gpus: Annotated[tuple[GpuIndex, ...], msgspec.Meta(max_length=4096)] = ()
    free: Count = 0
    held: Count = 0
    idle: Count = 0
    unhealthy: Count = 0
    fallback: Count = 0
    #: The mean utilisation (%) of the GPUs that measure one, as the agent reports it
    #: (rounded, changed at most every few minutes); ``None``: none measured, or not reported.
    utilisation: Annotated[int, msgspec.Meta(ge=0, le=100)] | None = None
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> bytes:
        """Encode for the store."""
        return encode_record(self)

    @classmethod
    def from_json(cls, raw: bytes) -> HostCounts:
        """Decode stored counts (``BadRecord`` if they are not)."""
        return decode_record(raw, cls)
