"""A submitted batch job (``allocator submit``): what the host's agent runs when its turn comes.

Stored under the submitter's own prefix (``<root>/submit/<user>/<job>``), so
on etcd with per-user roles only that user can have written it. It holds the
command, where it runs and what it asks for; never environment values
(they may hold secrets, and the store is readable by every user).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from allocator.records.codec import decode_record, encode_record
from allocator.records.fields import SCHEMA_VERSION, Argument, GpuIndex, Name, Slots, Text

__all__ = ["Submission"]


class Submission(msgspec.Struct, frozen=True):
    """One submitted job: exactly one of ``gpus`` or ``count``.

    ``output``: the file its stdout and stderr go to ("" for the agent's
    default, ``<log dir>/submit/<job>.log``). ``array_index``: its index in an
    array (``ALLOCATOR_ARRAY_INDEX``), ``None`` for a single job. ``time_s``:
    the run time asked for (``time=``), ``None`` for none.
    """

    job: Name
    user: Name
    host: Name
    argv: Annotated[tuple[Argument, ...], msgspec.Meta(min_length=1, max_length=4096)]
    cwd: Text
    submitted_at: Text
    gpus: Annotated[tuple[GpuIndex, ...], msgspec.Meta(max_length=1024)] | None = None
    count: Annotated[int, msgspec.Meta(ge=1, le=1024)] | None = None
    slots: Slots | None = None
    output: Text = ""
    array_index: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] | None = None
    time_s: Annotated[float, msgspec.Meta(gt=0)] | None = None
    #: ``--preemptible``: stopped and queued again when a normal request needs its GPUs,
    #: SIGKILL ``grace_s`` after SIGTERM (``None``: the agent's default).
    preemptible: bool = False
    grace_s: Annotated[float, msgspec.Meta(ge=0, le=3600)] | None = None
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if (self.gpus is None) == (self.count is None):
            raise ValueError("a submission asks for exactly one of gpus or count")

    def to_json(self) -> bytes:
        """Encode for the store."""
        return encode_record(self)

    @classmethod
    def from_json(cls, raw: bytes) -> Submission:
        """Decode a stored submission (``BadRecord`` if it is not one)."""
        return decode_record(raw, cls)
