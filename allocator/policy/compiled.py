"""The applied policy in compiled form: built once by ``policy apply``, read by every command.

This module builds and decodes the record (pure); :mod:`allocator.status.applied_policy`
reads it from the store and :mod:`allocator.control.compiled_policy` writes it.

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
KiB with values base64-encoded; when they would not fit together the
compiled record is left out (and an old one deleted), so a large policy
applies as before and its readers parse the YAML.
"""

from __future__ import annotations

from functools import cache

import msgspec

from allocator import __version__
from allocator.errors import BadRecord
from allocator.policy import model
from allocator.policy.model import Policy
from allocator.records.codec import decode_record
from allocator.records.types import CompiledPolicyRecord
from allocator.util.digest import sha256_hex

__all__ = ["COMPILED_FORMAT", "compile_policy", "compiled_format", "read_compiled"]

#: Bumped when the loader builds a different policy from the same YAML with the
#: same types (the model's types are fingerprinted on their own).
COMPILED_FORMAT = 1


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
    """The compiled record of ``policy``, built from the YAML whose hash is ``sha256``."""
    body = msgspec.json.encode(policy)
    record = CompiledPolicyRecord(sha256=sha256, format=compiled_format(), policy=msgspec.Raw(body))
    return record.to_json()


def read_compiled(raw: bytes, key: str, sha256: str) -> Policy | None:
    """The policy a compiled record holds, if it was built from ``sha256`` by this loader.

    ``None`` for a record of another policy or another format; ``BadRecord``
    for one that does not decode strictly.
    """
    record = decode_record(raw, CompiledPolicyRecord, key)
    if record.sha256 != sha256 or record.format != compiled_format():
        return None
    try:
        return msgspec.json.decode(record.policy, type=Policy)
    except msgspec.MsgspecError as exc:
        raise BadRecord(key, f"not a valid compiled policy: {exc}") from None
