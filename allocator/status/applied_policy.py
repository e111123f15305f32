"""The applied policy, read: its compiled form when that is current, else its YAML parsed.

See :mod:`allocator.policy.compiled` for why there are two forms and which
one a reader may trust.
"""

from __future__ import annotations

from collections.abc import Callable

from allocator.errors import BadRecord
from allocator.policy.compiled import read_compiled
from allocator.policy.model import Policy
from allocator.records.keys import KeyLayout
from allocator.records.types import PolicyRecord
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
        policy = _compiled_in(compiled.items[0] if compiled.items else None, record.sha256, on_bad)
    if policy is not None:
        return policy
    from allocator.policy.loader import load_policy  # PyYAML only when there is no other way

    return load_policy(record.yaml, source="applied policy")


def current_compiled(store: Store, layout: KeyLayout, sha256: str, on_bad: OnBad) -> Policy | None:
    """The compiled policy stored for the YAML whose hash is ``sha256``, if current."""
    return _compiled_in(store.get(layout.compiled_policy), sha256, on_bad)


def _compiled_in(item: KeyValue | None, sha256: str, on_bad: OnBad) -> Policy | None:
    if item is None:
        return None
    try:
        return read_compiled(item.value, item.key, sha256)
    except BadRecord as exc:
        on_bad(exc)
        return None
