"""Bounds checked before a policy is read: its size, and what its aliases expand to.

A YAML alias is a reference: ``*cmd`` used 3,000 times costs nothing to
parse but 3,000 copies to read, which is how a 100 KB file can exhaust
memory. The composed node graph is therefore measured first (linear in the
nodes written, whatever they expand to), and a file whose aliases add more
than a small budget is refused before any field is read.

The text limit is what the store can hold: the applied policy is stored as
one record whose value is the text, JSON-escaped, plus a few fields.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

import msgspec

from allocator.policy.yamlspec.reader import kind_of, line_of

if TYPE_CHECKING:
    from yaml.nodes import Node

__all__ = [
    "ALIAS_ALLOWANCE",
    "ALIAS_FACTOR",
    "MAX_NODES",
    "MAX_POLICY_BYTES",
    "RECORD_OVERHEAD_BYTES",
    "STORE_VALUE_BYTES",
    "expansion_problem",
    "size_problem",
]

#: The largest value every store backend holds (Consul's limit; the store's
#: ``MAX_VALUE_BYTES``, which a test keeps equal: the policy imports no store).
STORE_VALUE_BYTES: Final = 512 * 1024
#: Room kept in the stored record for its other fields (hash, who, when, source path).
RECORD_OVERHEAD_BYTES: Final = 10 * 1024
#: The most policy text the store holds, counted as stored (JSON-escaped UTF-8).
MAX_POLICY_BYTES: Final = STORE_VALUE_BYTES - RECORD_OVERHEAD_BYTES
#: The most YAML nodes a policy may expand to, aliases included.
MAX_NODES: Final = 250_000
#: Aliases may expand a policy to this many times the nodes it spells out ...
ALIAS_FACTOR: Final = 4
#: ... or by this many nodes, if that is more (small files with one template).
ALIAS_ALLOWANCE: Final = 10_000

_ENCODE = msgspec.json.Encoder().encode
# Where an alias (*name) can start; a false match (in a comment) only costs a walk.
_ALIAS = re.compile(r"(?:^|[\s\[{,:])\*")


def stored_size(text: str) -> int:
    """Bytes ``text`` takes in the stored record (JSON string, quotes excluded)."""
    return len(_ENCODE(text)) - 2


def size_problem(text: str) -> tuple[str, int] | None:
    """Why ``text`` is too large to store, and the line where it crosses the limit; or ``None``."""
    if len(text) <= MAX_POLICY_BYTES // 6:  # even all-escaped, this much fits
        return None
    if len(text) <= MAX_POLICY_BYTES and stored_size(text) <= MAX_POLICY_BYTES:
        return None
    total = 0
    line = 0
    for chunk in text.splitlines(keepends=True):
        line += 1
        total += stored_size(chunk)
        if total > MAX_POLICY_BYTES:
            break
    reason = (
        f"the policy is too large to store: it passes the limit of {MAX_POLICY_BYTES:,} bytes "
        f"(as stored, JSON-escaped) on this line"
    )
    return reason, max(line, 1)


def expansion_problem(root: Node, text: str) -> tuple[str, int | None] | None:
    """Why ``root``'s aliases expand too far (or refer to themselves), and where; or ``None``.

    Counts every node as the reader would visit it: an aliased node once per
    use. The walk visits each distinct node once, so it is cheap whatever the
    expansion; a text with no alias at all (``text``) is not walked.
    """
    if _ALIAS.search(text) is None:
        return None
    sizes: dict[int, int] = {}
    uses: dict[int, int] = {}
    nodes: dict[int, Node] = {}
    cycle = _measure(root, sizes, uses, nodes)
    if cycle is not None:
        return "an alias refers to a node that contains it (a recursive structure)", line_of(cycle)
    spelled = len(sizes)
    expanded = sizes[id(root)]
    allowed = min(MAX_NODES, max(ALIAS_FACTOR * spelled, spelled + ALIAS_ALLOWANCE))
    if expanded <= allowed:
        return None
    if spelled > MAX_NODES:
        return f"the policy has {spelled:,} YAML nodes; at most {MAX_NODES:,}", None
    culprit = max(
        (key for key, count in uses.items() if count > 1),
        key=lambda key: (uses[key] - 1) * sizes[key],
        default=id(root),
    )
    reason = (
        f"aliases expand the policy to {expanded:,} YAML nodes from the {spelled:,} it spells "
        f"out (at most {allowed:,}); the node here is used {uses.get(culprit, 1):,} times"
    )
    return reason, line_of(nodes[culprit])


def _children(node: Node) -> list[Node]:
    kind = kind_of(node)
    if kind == "sequence":
        return list(node.value)
    if kind == "mapping":
        return [part for pair in node.value for part in pair]
    return []


def _measure(
    root: Node, sizes: dict[int, int], uses: dict[int, int], nodes: dict[int, Node]
) -> Node | None:
    """Fill ``sizes`` (expanded node count) and ``uses`` (references) per node id.

    Iterative post-order, so deep nesting cannot overflow the stack; returns
    a node reached from inside itself, if any.
    """
    uses[id(root)] = 1
    nodes[id(root)] = root
    on_path: set[int] = {id(root)}
    stack: list[tuple[Node, list[Node]]] = [(root, _children(root))]
    while stack:
        node, pending = stack[-1]
        if pending:
            child = pending.pop()
            key = id(child)
            uses[key] = uses.get(key, 0) + 1
            if key in on_path:
                return child
            if key not in sizes and key not in nodes:
                nodes[key] = child
                on_path.add(key)
                stack.append((child, _children(child)))
            continue
        stack.pop()
        on_path.discard(id(node))
        sizes[id(node)] = 1 + sum(sizes[id(child)] for child in _children(node))
    return None
