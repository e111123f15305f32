"""The policy's shares as stored: what each agent reads instead of the whole policy.

``policy apply`` splits the policy (:mod:`allocator.policy.shares`) into a
*common* share, whose size follows the jobs, pools and rules, and one
*host* share per host (its entry, its pool's name, its reservations). Each
record wraps its share's compiled JSON (``body``) with the SHA-256 of that
JSON, the loader format that built it, and the policy whose apply wrote it;
the body is decoded by :mod:`allocator.policy.shares`, which knows the
model (records sit below it).
"""

from __future__ import annotations

import msgspec

from allocator.records.codec import encode_record
from allocator.records.fields import SCHEMA_VERSION, Sha256, Text

__all__ = ["PolicyShare", "SharesHead"]


class PolicyShare(msgspec.Struct, frozen=True):
    """One share of the applied policy: the common one, or one host's.

    ``policy_sha256``: the YAML of the apply that wrote it (a share left
    unchanged by later applies keeps its own). ``in_txn``: written in the
    same transaction as the policy record, so it never shows before its
    policy is applied (see :func:`allocator.policy.shares.shares_agree`).
    """

    policy_sha256: Sha256
    sha256: Sha256
    format: Text
    body: msgspec.Raw
    in_txn: bool = False
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> bytes:
        """Encode for the store."""
        return encode_record(self)


class SharesHead(msgspec.Struct, frozen=True):
    """The policy the shares are complete for; ``""`` while an apply writes them in batches.

    Read by ``policy apply`` only: when it names the applied policy, the
    shares stored are those of that policy, and the next apply writes only
    what its change changes; else it writes every share.
    """

    policy_sha256: str
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> bytes:
        """Encode for the store."""
        return encode_record(self)
