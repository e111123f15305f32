"""The policy: YAML file -> validated, frozen objects; its JSON Schema; its canonical form.

Importing this package imports none of its parts: each name is loaded on
first use (PEP 562), so code that needs only the model (placement,
``allocator set``) does not pay for the loader, the linter, the size limits
or PyYAML.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from allocator.policy.limits import MAX_POLICY_BYTES
    from allocator.policy.lint import PolicyWarning
    from allocator.policy.loader import (
        lint_policy,
        load_policy,
        load_policy_file,
        policy_json_schema,
        policy_sha256,
        policy_to_dict,
        read_policy_text,
    )
    from allocator.policy.model import (
        DEFAULT_IGNORED_XIDS,
        FallbackRule,
        HealthSettings,
        HistorySettings,
        Host,
        IdleRule,
        Job,
        Policy,
        Pool,
        Reservation,
        Sharing,
    )

__all__ = [
    "DEFAULT_IGNORED_XIDS",
    "MAX_POLICY_BYTES",
    "FallbackRule",
    "HealthSettings",
    "HistorySettings",
    "Host",
    "IdleRule",
    "Job",
    "Policy",
    "PolicyWarning",
    "Pool",
    "Reservation",
    "Sharing",
    "lint_policy",
    "load_policy",
    "load_policy_file",
    "policy_json_schema",
    "policy_sha256",
    "policy_to_dict",
    "read_policy_text",
]

_MODEL = [
    "DEFAULT_IGNORED_XIDS",
    "FallbackRule",
    "HealthSettings",
    "HistorySettings",
    "Host",
    "IdleRule",
    "Job",
    "Policy",
    "Pool",
    "Reservation",
    "Sharing",
]
_LOADER = [
    "lint_policy",
    "load_policy",
    "load_policy_file",
    "policy_json_schema",
    "policy_sha256",
    "policy_to_dict",
    "read_policy_text",
]
#: Where each exported name lives.
_HOMES = {
    "MAX_POLICY_BYTES": "allocator.policy.limits",
    "PolicyWarning": "allocator.policy.lint",
    **dict.fromkeys(_MODEL, "allocator.policy.model"),
    **dict.fromkeys(_LOADER, "allocator.policy.loader"),
}


def __getattr__(name: str) -> Any:
    """Load an exported name from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The exported names, as if they were imported already."""
    return sorted({*globals(), *__all__})
