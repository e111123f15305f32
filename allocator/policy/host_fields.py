"""The policy's host fields that take range patterns: the ``hosts`` section and a pool's ``hosts``.

``hosts: {node[0000-12499]: {gpus: 8, pool: a100}}`` declares 12,500 hosts;
the loaded :class:`~allocator.policy.model.Policy` has every one of them by
name, so nothing downstream knows ranges exist. A host written out on its
own, that a range also covers, is the range's exception: its own entry is
the one kept. Two ranges covering one host is an error naming the host.

Every expanded host's field paths (``hosts.node0042.pool``) get the line of
the key that declared it, so checks run after the walk point at that line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from allocator.policy.host_ranges import HOST_PATTERN_SCHEMA, expand_hosts, is_host_pattern
from allocator.policy.yamlspec.kinds import name_problem
from allocator.policy.yamlspec.reader import INVALID, Reader, join, kind_of, line_of
from allocator.policy.yamlspec.structures import Record

if TYPE_CHECKING:
    from yaml.nodes import Node

__all__ = ["HostList", "HostMap"]


def _host_names(key: str, limit: int) -> list[str] | str:
    """The names ``key`` declares, or why it declares none."""
    if not is_host_pattern(key):
        problem = name_problem(key, "host name")
        return problem if problem is not None else [key]
    try:
        return expand_hosts(key, limit)
    except ValueError as exc:
        return str(exc)


class HostMap:
    """The ``hosts`` section: host names, or range patterns, mapped to host records."""

    def __init__(self, record: Record, *, max_entries: int) -> None:
        self.record = record
        self.max_entries = max_entries

    def read(self, node: Node, path: str, r: Reader) -> Any:
        """Return ``{name: Host}`` for every host declared, ranges expanded, or ``INVALID``."""
        if not r.mapping(node, path, "a mapping of host names"):
            return INVALID
        declared = r.declared.setdefault(path, [])
        ranged: dict[str, tuple[Any, str]] = {}  # host -> (its range's Host, the range's path)
        explicit: dict[str, Any] = {}
        named = 0  # names made so far: ranges that repeat each other must not cost unbounded memory
        for key, key_node, value_node in r.pairs(node, path):
            child = join(path, key)
            r.lines[child] = line_of(key_node) or 0
            names = _host_names(key, self.max_entries)
            if isinstance(names, str):
                r.error_at(key_node, child, names)
                continue
            named += len(names)
            if named > 2 * self.max_entries:  # exceptions count twice; more is no fleet
                r.error_at(key_node, child, f"declares more than {self.max_entries:,} hosts")
                return INVALID
            declared.extend(names)
            value = self.record.read(value_node, child, r, name=names[0])
            if value is INVALID:
                continue
            if not is_host_pattern(key):
                explicit[key] = value
            else:
                self._add_range(key, child, names, value, ranged, r)
        hosts = {name: host for name, (host, _) in ranged.items() if name not in explicit}
        hosts.update(explicit)
        if len(hosts) > self.max_entries:
            r.error_at(node, path, f"declares {len(hosts):,} hosts; at most {self.max_entries:,}")
            return INVALID
        return hosts

    def _add_range(
        self,
        key: str,
        child: str,
        names: list[str],
        template: Any,
        ranged: dict[str, tuple[Any, str]],
        r: Reader,
    ) -> None:
        """Add one Host per name of the range ``key``, with the range's lines."""
        sub = {
            f".{field.key}": r.lines[f"{child}.{field.key}"]
            for field in self.record.fields
            if f"{child}.{field.key}" in r.lines
        }
        line = r.lines[child]
        for name in names:
            earlier = ranged.get(name)
            if earlier is not None:
                r.error_on(
                    child,
                    f"host {name!r} is also in {earlier[1]} (line {r.lines.get(earlier[1])}); "
                    "ranges must not overlap (a host written out on its own is an exception)",
                )
                return
            host_path = f"hosts.{name}"
            host = msgspec.structs.replace(template, name=name)
            ranged[name] = (host, child)
            r.lines.setdefault(host_path, line)
            for field, field_line in sub.items():
                r.lines.setdefault(host_path + field, field_line)
            r.origins[id(host)] = child

    def schema(self) -> dict[str, Any]:
        """A JSON object keyed by host names or range patterns."""
        return {
            "type": "object",
            "propertyNames": {"pattern": HOST_PATTERN_SCHEMA},
            "additionalProperties": self.record.schema(),
            "maxProperties": self.max_entries,
        }

    def dump(self, value: Any) -> Any:
        """Return ``{name: record}``, every host written out."""
        return {key: self.record.dump(item) for key, item in value.items()}


class HostList:
    """A pool's ``hosts``: host names or range patterns, each host once."""

    def __init__(self, *, max_items: int) -> None:
        self.max_items = max_items

    def read(self, node: Node, path: str, r: Reader) -> Any:
        """Return the hosts listed, ranges expanded, or ``INVALID`` when the node is no list."""
        if not r.sequence(node, path):
            return INVALID
        hosts: list[str] = []
        kept_paths = r.item_paths.setdefault(path, [])
        first: dict[str, str] = {}
        for index, child in enumerate(node.value):
            child_path = f"{path}[{index}]"
            r.lines[child_path] = line_of(child) or 0
            names = self._item(child, child_path, r)
            if len(hosts) + len(names) > self.max_items:
                r.error_at(node, path, f"lists more than {self.max_items:,} hosts")
                return INVALID
            for name in names:
                if name in first:
                    r.error_at(
                        child, child_path, f"host {name!r} is listed twice (first at {first[name]})"
                    )
                    continue
                first[name] = child_path
                hosts.append(name)
                kept_paths.append(child_path)
        return tuple(hosts)

    def _item(self, node: Node, path: str, r: Reader) -> list[str]:
        if kind_of(node) != "scalar":
            r.error_at(node, path, "expected a host name or range pattern")
            return []
        value = r.scalar(node, path, "a host name", text=True)
        if not isinstance(value, str):
            if value is not INVALID:
                r.error_at(node, path, f"expected a host name, got {value!r}; quote it")
            return []
        names = _host_names(value, self.max_items)
        if isinstance(names, str):
            r.error_at(node, path, names)
            return []
        return names

    def schema(self) -> dict[str, Any]:
        """A JSON array of host names or range patterns."""
        return {
            "type": "array",
            "items": {"type": "string", "pattern": HOST_PATTERN_SCHEMA},
            "maxItems": self.max_items,
            "uniqueItems": True,
        }

    def dump(self, value: Any) -> Any:
        """Return a JSON list of host names."""
        return list(value)
