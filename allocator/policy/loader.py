"""Loading a policy: text -> node tree -> checked, frozen :class:`Policy`.

All validation happens here, in one pass that collects every problem;
the first one becomes the message of the single :class:`PolicyError`
raised, and all of them are in its ``errors``. Sizes are checked before
work is done: the text against what the store holds, the node graph
against what its aliases expand to (:mod:`allocator.policy.limits`).

A process parses the same text once: ``set`` retrying a lost race, or
``status`` joining hosts, reads the applied policy again and gets the
policy already built (keyed by the text's SHA-256).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from datetime import datetime
from typing import Any

from allocator.errors import PolicyError
from allocator.policy.checks import check_policy
from allocator.policy.limits import MAX_POLICY_BYTES, expansion_problem, size_problem
from allocator.policy.lint import PolicyWarning, policy_warnings
from allocator.policy.model import Policy
from allocator.policy.spec import POLICY
from allocator.policy.yamlspec.reader import Reader, describe_node, is_null, kind_of, line_of
from allocator.util.digest import sha256_hex

__all__ = [
    "lint_policy",
    "load_policy",
    "load_policy_file",
    "policy_json_schema",
    "policy_sha256",
    "policy_to_dict",
    "read_policy_text",
]

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
#: Policies kept built, by (sha256, source): the applied one and a file or two.
_CACHE_SIZE = 4
_CACHE: OrderedDict[tuple[str, str], Policy] = OrderedDict()


def load_policy(text: str, source: str = "<policy>") -> Policy:
    """Parse and validate policy YAML; raise ``PolicyError`` naming file, line and field.

    The same text (and source) is parsed once per process; the policy is
    frozen, so every caller can share it.
    """
    key = (policy_sha256(text), source)
    cached = _CACHE.get(key)
    if cached is not None:
        _CACHE.move_to_end(key)
        return cached
    policy, _ = _load(text, source)
    _CACHE[key] = policy
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return policy


def lint_policy(text: str, source: str, now: datetime) -> tuple[Policy, tuple[PolicyWarning, ...]]:
    """Load ``text`` like :func:`load_policy`, and return the warnings about it at ``now``."""
    policy, r = _load(text, source)
    return policy, policy_warnings(policy, source, r.lines, r.origins, now)


def _load(text: str, source: str) -> tuple[Policy, Reader]:
    from allocator.policy.yamlspec.document import compose  # PyYAML only when a policy is read

    too_large = size_problem(text)
    if too_large is not None:
        raise PolicyError(too_large[0], file=source, line=too_large[1])
    root, construct = compose(text, source)
    if root is None or is_null(root):
        raise PolicyError(
            "the policy is empty (it needs at least 'version: 1')", file=source, line=1
        )
    expands = expansion_problem(root, text)
    if expands is not None:
        raise PolicyError(expands[0], file=source, line=expands[1])
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
    return Policy(**values), r


def load_policy_file(path: str | os.PathLike[str]) -> Policy:
    """Read and validate a policy file; an unreadable file is a ``PolicyError`` too."""
    source = os.fspath(path)
    return load_policy(read_policy_text(path), source)


def read_policy_text(path: str | os.PathLike[str]) -> str:
    """Return a policy file's text, or raise ``PolicyError`` saying why it cannot be read.

    At most what the store can hold is read: a larger file is refused with
    the line where it passes the limit, before it is parsed.
    """
    source = os.fspath(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_POLICY_BYTES + 1)
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        raise PolicyError(f"cannot read policy file: {reason}", file=source) from exc
    if len(data) > MAX_POLICY_BYTES:
        line = data.count(b"\n", 0, MAX_POLICY_BYTES) + 1
        reason = (
            f"the policy file is too large: it passes the limit of {MAX_POLICY_BYTES:,} bytes "
            "(what the store holds) on this line"
        )
        raise PolicyError(reason, file=source, line=line)
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
    return sha256_hex(text.encode("utf-8", "surrogatepass"))
