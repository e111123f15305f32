"""The policy: YAML file -> validated, frozen objects; its JSON Schema; its canonical form.

Importing this package does not import PyYAML; reading a policy does.
"""

from __future__ import annotations

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
