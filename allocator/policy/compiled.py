"""The applied policy in compiled form: built once by ``policy apply``, read by every command.

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

from collections.abc import Callable
from functools import cache

import msgspec

from allocator import __version__
from allocator.errors import BadRecord, PermissionDenied
from allocator.policy import model
from allocator.policy.model import Policy
from allocator.records.keys import KeyLayout
from allocator.records.types import CompiledPolicyRecord, PolicyRecord, decode_record
from allocator.store.base import (
    MAX_VALUE_BYTES,
    Compare,
    Delete,
    KeyValue,
    Listing,
    Op,
    Put,
    Store,
)
from allocator.util.digest import sha256_hex

__all__ = [
    "COMPILED_FORMAT",
    "TXN_VALUE_BUDGET",
    "applied_policy",
    "compile_policy",
    "compiled_format",
    "compiled_op",
    "read_compiled",
    "refresh_compiled",
    "write_with_compiled",
]

#: Bumped when the loader builds a different policy from the same YAML with the
#: same types (the model's types are fingerprinted on their own).
COMPILED_FORMAT = 1
#: The most bytes the policy record and its compiled record may take together:
#: Consul base64-encodes (4/3) the values of a transaction body of at most 512
#: KiB, and the apply's history entry and keys need some of it.
TXN_VALUE_BUDGET = MAX_VALUE_BYTES * 3 // 4 - 16 * 1024

OnBad = Callable[[BadRecord], None]
Txn = Callable[[list[Compare], list[Op]], int]


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


def compiled_op(layout: KeyLayout, policy: Policy, sha256: str, record_size: int) -> Op:
    """What the apply's transaction does with the compiled record.

    A put of ``policy`` compiled, or, when it would not fit next to the
    policy record (``record_size`` bytes) in one transaction, a delete of
    any older one.
    """
    compiled = compile_policy(policy, sha256)
    if record_size + len(compiled) > TXN_VALUE_BUDGET:
        return Delete(layout.compiled_policy)
    return Put(layout.compiled_policy, compiled)


def write_with_compiled(
    txn: Txn, compares: list[Compare], ops: list[Op], compiled: Op
) -> tuple[int, bool]:
    """Run the apply's transaction with ``compiled`` in it: its revision, and whether it stored one.

    A user allowed to write the policy but not the compiled key (a CI role
    granted before there was one) still applies the policy, without its
    compiled form: commands then parse the YAML.
    """
    try:
        return txn(compares, [*ops, compiled]), isinstance(compiled, Put)
    except PermissionDenied:
        return txn(compares, ops), False


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


def applied_policy(
    store: Store,
    layout: KeyLayout,
    record: PolicyRecord,
    on_bad: OnBad,
    compiled: Listing | None = None,
) -> Policy:
    """The policy ``record`` holds: its compiled form when that is current, else its YAML parsed.

    ``compiled``: a read of the compiled key made together with the policy
    key's (one request instead of two); without it, the key is read here.
    """
    if compiled is None:
        policy = _current_compiled(store, layout, record.sha256, on_bad)
    else:
        policy = _compiled_in(compiled.items[0] if compiled.items else None, record.sha256, on_bad)
    if policy is not None:
        return policy
    from allocator.policy.loader import load_policy  # PyYAML only when there is no other way

    return load_policy(record.yaml, source="applied policy")


def refresh_compiled(
    store: Store, layout: KeyLayout, policy: Policy, record: bytes, sha256: str, revision: int
) -> bool:
    """Write the compiled form of the applied ``policy`` if it is missing or stale.

    ``record`` is the stored policy record, at ``revision``; the write
    compares that revision, so a policy applied meanwhile is never given
    this one's compiled form. A re-apply of the same file after an upgrade
    is how an operator gets the fast path back. Returns whether the stored
    compiled form is current now: not when the policy is too large to have
    one, or this user may not write its key.
    """
    if _current_compiled(store, layout, sha256, lambda _bad: None) is not None:
        return True
    op = compiled_op(layout, policy, sha256, len(record))
    try:
        if isinstance(op, Put) or store.get(op.key) is not None:
            store.txn([Compare(layout.policy, revision)], [op])
    except PermissionDenied:
        return False
    return isinstance(op, Put)


def _current_compiled(store: Store, layout: KeyLayout, sha256: str, on_bad: OnBad) -> Policy | None:
    return _compiled_in(store.get(layout.compiled_policy), sha256, on_bad)


def _compiled_in(item: KeyValue | None, sha256: str, on_bad: OnBad) -> Policy | None:
    if item is None:
        return None
    try:
        return read_compiled(item.value, item.key, sha256)
    except BadRecord as exc:
        on_bad(exc)
        return None
