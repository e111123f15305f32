"""The applied policy, read: its compiled form when that is current, else its YAML parsed.

See :mod:`allocator.policy.compiled` for why there are two forms and which
one a reader may trust.
"""

from __future__ import annotations

from collections.abc import Callable

from allocator.errors import BadRecord, PermissionDenied
from allocator.policy.compiled import decode_compiled, join_parts, read_compiled_head
from allocator.policy.model import Policy
from allocator.records.keys import KeyLayout
from allocator.records.types import PolicyRecord
from allocator.status.part_cache import PARTS
from allocator.store.base import KeyValue, Listing, Store

__all__ = ["OnBad", "applied_policy", "current_compiled"]

OnBad = Callable[[BadRecord], None]


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
        policy = current_compiled(store, layout, record.sha256, on_bad)
    else:
        item = compiled.items[0] if compiled.items else None
        policy = _compiled_in(store, layout, item, record.sha256, on_bad)
    if policy is not None:
        return policy
    from allocator.policy.loader import load_policy  # PyYAML only when there is no other way

    return load_policy(record.yaml, source="applied policy")


def current_compiled(store: Store, layout: KeyLayout, sha256: str, on_bad: OnBad) -> Policy | None:
    """The compiled policy stored for the YAML whose hash is ``sha256``, if current."""
    return _compiled_in(store, layout, store.get(layout.compiled_policy), sha256, on_bad)


def _compiled_in(
    store: Store, layout: KeyLayout, item: KeyValue | None, sha256: str, on_bad: OnBad
) -> Policy | None:
    """The policy of the compiled record ``item``, its parts read when it has them."""
    if item is None:
        return None
    try:
        head = read_compiled_head(item.value, item.key, sha256)
        if head is None:
            return None
        if not head.parts:
            return decode_compiled(head.policy, item.key)
        # join_parts takes only the parts the record names, and checks what they make.
        parts = PARTS.read(store, layout, head.part_sha256)
        body = join_parts(head, parts)
        if body is None:
            on_bad(BadRecord(item.key, f"its {head.parts} part(s) are missing or damaged"))
            return None
        PARTS.keep(head.part_sha256, parts)
        return decode_compiled(body, item.key)
    except BadRecord as exc:
        on_bad(exc)
        return None
    except PermissionDenied:  # a role granted the record but not its parts: the YAML
        return None
