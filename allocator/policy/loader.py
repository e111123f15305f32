"""Loading a policy: text -> node tree -> checked, frozen :class:`Policy`.

All validation happens here, in one pass that collects every problem;
the first one becomes the message of the single :class:`PolicyError`
raised, and all of them are in its ``errors``.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from allocator.errors import PolicyError
from allocator.policy.checks import check_policy
from allocator.policy.model import Policy
from allocator.policy.reader import Reader, describe_node, is_null, kind_of, line_of
from allocator.policy.spec import POLICY

__all__ = [
    "load_policy",
    "load_policy_file",
    "policy_json_schema",
    "policy_sha256",
    "policy_to_dict",
]

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def load_policy(text: str, source: str = "<policy>") -> Policy:
    """Parse and validate policy YAML; raise ``PolicyError`` naming file, line and field."""
    from allocator.policy.document import compose  # PyYAML only when a policy is read

    root, construct = compose(text, source)
    if root is None or is_null(root):
        raise PolicyError(
            "the policy is empty (it needs at least 'version: 1')", file=source, line=1
        )
    r = Reader(source, construct)
    if kind_of(root) != "mapping":
        got = describe_node(root) if kind_of(root) != "scalar" else "a single value"
        raise PolicyError(
            f"the top level must be a mapping of sections (version, hosts, jobs, ...), got {got}",
            file=source,
            line=line_of(root),
        )
    values = POLICY.read_values(root, "", r)
    if isinstance(values, dict):
        values = check_policy(values, r)
    if r.errors:
        raise _combined(r.errors)
    return Policy(**values)


def load_policy_file(path: str | os.PathLike[str]) -> Policy:
    """Read and validate a policy file; an unreadable file is a ``PolicyError`` too."""
    source = os.fspath(path)
    return load_policy(read_policy_text(path), source)


def read_policy_text(path: str | os.PathLike[str]) -> str:
    """Return a policy file's text, or raise ``PolicyError`` saying why it cannot be read."""
    source = os.fspath(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        raise PolicyError(f"cannot read policy file: {reason}", file=source) from exc
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        reason = f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        raise PolicyError(reason, file=source, line=line) from exc


def _combined(errors: list[PolicyError]) -> PolicyError:
    """One error for many: the first (by line) as the message, all of them attached."""
    unique: dict[tuple[int, str | None, str], PolicyError] = {}
    for error in errors:
        unique.setdefault((error.line or 0, error.field, error.reason), error)
    ordered = sorted(unique.values(), key=lambda e: e.line or 0)
    first = ordered[0]
    more = f" (and {len(ordered) - 1} more)" if len(ordered) > 1 else ""
    return PolicyError(
        first.reason + more,
        file=first.file,
        line=first.line,
        field=first.field,
        errors=tuple(ordered),
    )


def policy_to_dict(policy: Policy) -> dict[str, Any]:
    """Return ``policy`` as canonical JSON-ready data, every field spelled out.

    The result uses the file's own keys, so it can be written back as YAML
    (or JSON) and loads to an equal policy.
    """
    data: dict[str, Any] = POLICY.dump(policy)
    return data


def policy_json_schema() -> dict[str, Any]:
    """Return the JSON Schema (draft 2020-12) of a policy file, built from the loader's spec."""
    schema: dict[str, Any] = {
        "$schema": JSON_SCHEMA_DIALECT,
        "title": "allocator policy",
    }
    schema.update(POLICY.schema())
    return schema


def policy_sha256(text: str) -> str:
    """Return the hex SHA-256 of the policy text (UTF-8), as stored with an applied policy."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
