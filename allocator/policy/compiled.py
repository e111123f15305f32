"""The applied policy in compiled form: built once by ``policy apply``, read by every command.

This module builds and decodes the record (pure); :mod:`allocator.status.applied_policy`
reads it from the store and :mod:`allocator.control.apply.compiled` writes it.

Parsing YAML is most of what a quick command like ``allocator set`` would
spend on the policy (PyYAML's import alone, then the loader). So ``policy
apply`` stores, in the same transaction as the YAML, the policy it built:
the model encoded as msgspec JSON, with the YAML's SHA-256 and the format
of the loader that built it. A reader uses it only when both match the
applied YAML record and its own loader; anything else (no compiled record,
another allocator version, a policy changed since) falls back to parsing
the YAML, which stays the record of truth (``policy show`` prints it). A
compiled record that does not decode strictly is a bad record: reported,
then the YAML is parsed.

A compiled record is trusted as much as the YAML record next to it: both
are written by whoever may write the policy key. The agent, which runs the
commands a policy names, keeps reading the YAML.

Both records travel in one transaction, whose body Consul limits to 512
KiB with values base64-encoded. A compiled policy too large to travel
beside the YAML (a fleet of thousands of hosts) is stored in parts: the
record then holds no policy but the SHA-256 of each part, in order, and of
their joined JSON. A part lives under a key named by its own SHA-256, so a
part two policies share is stored once: the parts are cut between hosts,
where a host's name says so (:func:`cut_parts`), and a change to one host
writes the part that holds it and the record, not the whole policy. A
reader joins the parts its record names and checks the whole hash, so it
never combines parts of two different compiled policies; parts it cannot
find or join are as if there were no compiled record.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Mapping
from functools import cache

import msgspec

from allocator import __version__
from allocator.errors import BadRecord
from allocator.policy import model
from allocator.policy.model import Policy
from allocator.records.codec import decode_record
from allocator.records.types import CompiledPolicyRecord
from allocator.util.digest import sha256_hex

__all__ = [
    "COMPILED_FORMAT",
    "PART_BYTES",
    "Compiled",
    "compile_policy",
    "compiled_format",
    "cut_parts",
    "decode_compiled",
    "join_parts",
    "read_compiled",
    "read_compiled_head",
    "split_compiled",
]

#: Bumped when the loader builds a different policy from the same YAML with the
#: same types (the model's types are fingerprinted on their own). 2: in parts.
#: 3: parts named by their own hash, cut between hosts.
COMPILED_FORMAT = 3
#: The most bytes of compiled JSON one part holds. Small, so that a change to
#: one host rewrites little; the record names every part, so not tiny either.
PART_BYTES = 16 * 1024
_NULL = msgspec.Raw(b"null")
#: Stands for the hosts while the rest of the policy is encoded around them.
_HOSTS_MARK = msgspec.Raw(b"\x00")
_ENCODER = msgspec.json.Encoder()


@cache
def compiled_format() -> str:
    """The format this allocator writes and reads: its version and its model's fingerprint.

    The allocator's version is in it because a newer loader may refuse, or
    read differently, a policy an older one accepted: a compiled policy is
    read only by the loader that would have built it.
    """
    return f"{COMPILED_FORMAT}:{__version__}:{_model_fingerprint()}"


def _model_fingerprint() -> str:
    """A hash of every model class's fields and their types.

    The model's annotations are objects, not text (it does not defer them),
    so their reprs name the types themselves: ``Literal['uuid', 'index']``.
    """
    parts = []
    for name in sorted(model.__all__):
        cls = getattr(model, name)
        if isinstance(cls, type) and issubclass(cls, msgspec.Struct):
            hints = cls.__annotations__
            fields = ",".join(f"{f}:{hints[f]!r}" for f in cls.__struct_fields__)
            parts.append(f"{name}({fields})")
    return sha256_hex("|".join(parts).encode())[:16]


def compile_policy(policy: Policy, sha256: str) -> bytes:
    """The compiled record of ``policy`` in one value, from the YAML whose hash is ``sha256``."""
    body = msgspec.json.encode(policy)
    record = CompiledPolicyRecord(sha256=sha256, format=compiled_format(), policy=msgspec.Raw(body))
    return record.to_json()


class Compiled(msgspec.Struct, frozen=True):
    """A compiled policy ready to store: its record, and its parts when it needs them.

    ``parts``: each part's JSON by its SHA-256 (its key's name), in order;
    empty when ``record`` holds the policy.
    """

    record: bytes
    parts: dict[str, bytes] = msgspec.field(default_factory=dict)


def split_compiled(
    policy: Policy, sha256: str, inline_budget: int, part_bytes: int = PART_BYTES
) -> Compiled:
    """``policy`` compiled: in its record if at most ``inline_budget`` bytes, else in parts.

    Parts hold at most ``part_bytes`` each, about a quarter of that on average.
    """
    body = msgspec.json.encode(policy)
    if len(body) < inline_budget:  # the record is larger than the JSON it holds
        inline = CompiledPolicyRecord(sha256, compiled_format(), msgspec.Raw(body)).to_json()
        if len(inline) <= inline_budget:
            return Compiled(inline)
    cut = cut_parts(policy, part_bytes)
    names = tuple(sha256_hex(part) for part in cut)
    head = CompiledPolicyRecord(
        sha256,
        compiled_format(),
        _NULL,
        parts=len(cut),
        body_sha256=sha256_hex(body),
        part_sha256=names,
    )
    return Compiled(head.to_json(), dict(zip(names, cut, strict=True)))


def cut_parts(policy: Policy, part_bytes: int) -> list[bytes]:
    """The compiled JSON of ``policy`` in pieces that join to it, cut between hosts.

    A cut follows a host whose name's CRC-32 falls below its entry's share
    of ``part_bytes // 4``: a choice that depends on that host alone, so a
    change to one host's entry rewrites the part that holds it, not every
    part after it. A part that would grow past ``part_bytes`` is cut there.
    """
    frame = _ENCODER.encode(msgspec.structs.replace(policy, hosts=_HOSTS_MARK))
    # The mark is a NUL byte, which JSON strings escape: its one place is the hosts'.
    at = frame.index(b"\x00")
    entries = [
        _ENCODER.encode(name) + b":" + _ENCODER.encode(h) for name, h in policy.hosts.items()
    ]
    ends = _cuts(list(policy.hosts), [len(entry) + 1 for entry in entries], part_bytes)
    parts = [
        (b"," if start else b"") + b",".join(entries[start:end])
        for start, end in itertools.pairwise([0, *ends])
    ]
    parts[0] = frame[:at] + b"{" + parts[0]
    parts[-1] += b"}" + frame[at + 1 :]
    return [
        part[start : start + part_bytes]
        for part in parts
        for start in range(0, len(part), part_bytes)
    ]


def _cuts(names: list[str], sizes: list[int], part_bytes: int) -> list[int]:
    """Where the hosts' entries are cut (the index after each part's last), the last included."""
    target = max(1, part_bytes // 4)
    ends: list[int] = []
    size = 0
    for index, (name, grows) in enumerate(zip(names, sizes, strict=True)):
        if size + grows > part_bytes and size:
            ends.append(index)
            size = 0
        size += grows
        if zlib.crc32(name.encode()) % target < grows:
            ends.append(index + 1)
            size = 0
    if not ends or ends[-1] != len(names):
        ends.append(len(names))
    return ends


def read_compiled_head(raw: bytes, key: str, sha256: str) -> CompiledPolicyRecord | None:
    """The compiled record, if it was built from ``sha256`` by this loader.

    ``None`` for a record of another policy or another format; ``BadRecord``
    for one that does not decode strictly, or says it has parts but does not
    name them and their joined JSON.
    """
    record = decode_record(raw, CompiledPolicyRecord, key)
    if record.sha256 != sha256 or record.format != compiled_format():
        return None
    if record.parts < 0 or (
        record.parts > 0 and (record.body_sha256 is None or len(record.part_sha256) != record.parts)
    ):
        raise BadRecord(key, "a compiled policy in parts needs their hashes and their JSON's")
    return record


def join_parts(head: CompiledPolicyRecord, stored: Mapping[str, bytes]) -> bytes | None:
    """The compiled JSON ``head``'s parts make, from ``stored`` (parts by their hash).

    ``None`` when a part is missing or the joined bytes are not the ones
    ``head`` names (a part altered in place cannot pass).
    """
    if not all(name in stored for name in head.part_sha256):
        return None
    body = b"".join(stored[name] for name in head.part_sha256)
    return body if sha256_hex(body) == head.body_sha256 else None


def decode_compiled(body: bytes, key: str) -> Policy:
    """The policy of compiled JSON; ``BadRecord`` when it does not decode strictly."""
    try:
        return msgspec.json.decode(body, type=Policy)
    except msgspec.MsgspecError as exc:
        raise BadRecord(key, f"not a valid compiled policy: {exc}") from None


def read_compiled(raw: bytes, key: str, sha256: str) -> Policy | None:
    """The policy a compiled record holds in itself, if it was built from ``sha256`` by this loader.

    ``None`` for a record of another policy or another format, or one in
    parts (see :func:`join_parts`); ``BadRecord`` for one that does not
    decode strictly.
    """
    record = read_compiled_head(raw, key, sha256)
    if record is None or record.parts:
        return None
    return decode_compiled(record.policy, key)
