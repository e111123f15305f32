"""How records are stored: compact JSON out, strict typed decoding back in.

:func:`decode_record` checks JSON syntax, every field's type and range (the
struct's annotations, :mod:`allocator.records.fields`), ``schema_version``,
and that the names in the body agree with the key. The record types
themselves are in :mod:`allocator.records.types`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, TypeVar

import msgspec

from allocator.errors import BadRecord
from allocator.records.fields import SCHEMA_VERSION

__all__ = ["current_record", "decode_record", "encode_record", "prepare_decoders", "replace_struct"]

R = TypeVar("R", bound=msgspec.Struct)

_ENCODER = msgspec.json.Encoder()


def replace_struct(record: R, **changes: Any) -> R:
    """A copy of ``record`` (any of the structs here) with ``changes`` applied."""
    return msgspec.structs.replace(record, **changes)


class _Header(msgspec.Struct):
    schema_version: Any = None


def encode_record(record: msgspec.Struct) -> bytes:
    """The stored form of ``record``: compact JSON, fields in declaration order.

    Publishers compare encoded bytes to skip unchanged writes, so callers build
    mappings (``AgentRecord.unhealthy``) in sorted order.
    """
    return _ENCODER.encode(record)


def decode_record(raw: bytes, kind: type[R], key: str = "", **names: str | None) -> R:
    """Decode ``raw`` as ``kind``, or raise :class:`BadRecord` saying what is wrong.

    ``names`` are the names the key says the record has (``job="train"``,
    ``host="node1"``); a body that names another is a bad record.
    """
    record = current_record(raw, kind)
    if record is None:
        record = _checked_record(raw, kind, key)
    for field, expected in names.items():
        actual = getattr(record, field)
        if expected is not None and actual != expected:
            raise BadRecord(
                key, f"its {field} {actual!r} disagrees with the key, which says {expected!r}"
            )
    return record


#: How a record this allocator wrote ends: its schema_version, the last field.
_CURRENT_TAIL = b',"schema_version":%d}' % SCHEMA_VERSION


_DECODERS: dict[type[Any], msgspec.json.Decoder[Any]] = {}


def prepare_decoders(kinds: Iterable[type[Any]]) -> None:
    """Build each kind's decoder now, not at its first record.

    A command server does this once before it forks its workers: building a
    decoder reads the record's annotations, milliseconds a command would spend.
    """
    for kind in kinds:
        if kind not in _DECODERS:
            _DECODERS[kind] = msgspec.json.Decoder(kind)


def current_record(raw: bytes, kind: type[R]) -> R | None:
    """``raw`` decoded in one pass when it ends as this allocator writes records; else None.

    A valid JSON object that ends so has ``schema_version`` 1 as its last
    member, so the separate version check has nothing to add: a fleet's
    status decodes 13,000 records. Anything else takes the checked path
    (:func:`decode_record`, which says what is wrong). The names in the
    body are not compared with the key here: a caller that uses this
    directly compares them, and decodes a record that disagrees with
    :func:`decode_record` for its message.
    """
    if not raw.endswith(_CURRENT_TAIL):
        return None
    decoder = _DECODERS.get(kind)
    if decoder is None:  # one per kind: building it each time was a third of the decode
        decoder = _DECODERS[kind] = msgspec.json.Decoder(kind)
    try:
        return decoder.decode(raw)  # type: ignore[no-any-return]
    except msgspec.MsgspecError:
        return None  # the checked path says what is wrong


def _checked_record(raw: bytes, kind: type[R], key: str) -> R:
    """``raw`` decoded after its schema_version is checked; BadRecord saying what is wrong."""
    what = _kind_words(kind)
    version = _stored_version(raw, key, what)
    if version is None:
        raise BadRecord(key, f"{what} has no schema_version")
    if version != SCHEMA_VERSION:
        raise BadRecord(
            key,
            f"{what} has schema_version {version!r}; this allocator reads {SCHEMA_VERSION}"
            + (" (written by a newer allocator? upgrade)" if isinstance(version, int) else ""),
        )
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.MsgspecError as exc:
        raise BadRecord(key, f"not a valid {what}: {exc}") from None


def _kind_words(kind: type[Any]) -> str:
    """What a record of ``kind`` is called in messages: ``JobIndex`` is "job index"."""
    return re.sub(r"(?<!^)(?=[A-Z])", " ", kind.__name__).lower()


def _stored_version(raw: bytes, key: str, what: str) -> object:
    """The record's ``schema_version`` (None when absent); BadRecord if it is no JSON object."""
    try:
        return msgspec.json.decode(raw, type=_Header).schema_version
    except msgspec.ValidationError:
        raise BadRecord(key, f"{what} is not a JSON object") from None
    except msgspec.DecodeError as exc:
        raise BadRecord(key, f"{what} is not valid JSON: {exc}") from None
