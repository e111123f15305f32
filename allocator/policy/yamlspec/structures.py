"""Container kinds of the policy's field spec: lists, maps and records.

A :class:`Record` maps YAML keys to the fields of one model dataclass
(:mod:`allocator.policy.model`); the dataclass's defaults are the policy's
defaults, and they also become the ``default`` of the JSON Schema.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from allocator.policy.yamlspec.kinds import NAME_PATTERN, Kind, name_problem, suggest
from allocator.policy.yamlspec.reader import INVALID, Reader, is_null, join, line_of

if TYPE_CHECKING:
    from yaml.nodes import Node

__all__ = ["EnvMap", "Field", "ListOf", "NameMap", "OnlyWhen", "Record"]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)


def _show(value: object) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _within(node: Node, path: str, r: Reader, limit: int, what: str) -> bool:
    """Whether a mapping has at most ``limit`` entries; reports it when not."""
    if len(node.value) <= limit:
        return True
    r.error_at(node, path, f"has {len(node.value):,} {what}; at most {limit:,}")
    return False


class ListOf:
    """A list of one kind; ``unique`` refuses repeated items."""

    def __init__(
        self,
        item: Kind,
        *,
        min_items: int = 0,
        max_items: int = 100_000,
        unique: bool = False,
        label: str = "item",
        collect: Callable[[Iterable[Any]], Any] = tuple,
    ) -> None:
        self.item = item
        self.min_items = min_items
        self.max_items = max_items
        self.unique = unique
        self.label = label
        self.collect = collect

    def read(self, node: Node, path: str, r: Reader) -> Any:
        """Return the readable items (collected), or ``INVALID`` when the node is no list."""
        if not r.sequence(node, path):
            return INVALID
        if len(node.value) < self.min_items:
            r.error_at(node, path, f"needs at least {self.min_items} {self.label}(s)")
            return INVALID
        if len(node.value) > self.max_items:
            r.error_at(
                node,
                path,
                f"has {len(node.value):,} {self.label}s; at most {self.max_items:,}",
            )
            return INVALID
        items: list[Any] = []
        kept_paths = r.item_paths.setdefault(path, [])
        first_index: dict[Any, int] = {}
        for index, child in enumerate(node.value):
            child_path = f"{path}[{index}]"
            r.lines[child_path] = line_of(child) or 0
            value = self.item.read(child, child_path, r)
            if value is INVALID:
                continue
            if self.unique and value in first_index:
                where = f"first at {path}[{first_index[value]}]"
                r.error_at(
                    child, child_path, f"{self.label} {_show(value)} is listed twice ({where})"
                )
                continue
            if self.unique:
                first_index[value] = index
            items.append(value)
            kept_paths.append(child_path)
        return self.collect(items)

    def schema(self) -> dict[str, Any]:
        """A JSON array of the item's schema."""
        schema: dict[str, Any] = {
            "type": "array",
            "items": self.item.schema(),
            "maxItems": self.max_items,
        }
        if self.min_items:
            schema["minItems"] = self.min_items
        if self.unique:
            schema["uniqueItems"] = True
        return schema

    def dump(self, value: Any) -> Any:
        """Return a JSON list (sets sorted, so the output is canonical)."""
        items = sorted(value) if isinstance(value, frozenset | set) else value
        return [self.item.dump(item) for item in items]


class EnvMap:
    """Environment variables: names like ``OMP_NUM_THREADS`` mapped to strings.

    Variables the agent itself sets from the assignment are refused, since a
    job setting them would silently escape its GPUs.
    """

    def __init__(
        self,
        value: Kind,
        reserved: tuple[str, ...],
        reserved_prefix: str,
        *,
        max_entries: int,
    ) -> None:
        self.value = value
        self.reserved = reserved
        self.reserved_prefix = reserved_prefix
        self.max_entries = max_entries

    def read(self, node: Node, path: str, r: Reader) -> Any:
        """Return a ``dict`` of the readable entries, or ``INVALID``."""
        if not r.mapping(node, path) or not _within(node, path, r, self.max_entries, "variables"):
            return INVALID
        result: dict[str, Any] = {}
        for key, key_node, value_node in r.pairs(node, path):
            child = join(path, key)
            r.lines[child] = line_of(key_node) or 0
            problem = self._key_problem(key)
            if problem is not None:
                r.error_at(key_node, child, problem)
                continue
            value = self.value.read(value_node, child, r)
            if value is not INVALID:
                result[key] = value
        return result

    def _key_problem(self, key: str) -> str | None:
        if not _ENV_NAME.fullmatch(key):
            return f"{key!r} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
        if key in self.reserved or key.startswith(self.reserved_prefix):
            return f"{key} is set by the agent from the assignment; a job cannot set it"
        return None

    def schema(self) -> dict[str, Any]:
        """A JSON object of strings with environment-variable names."""
        reserved = "|".join([*self.reserved, f"{self.reserved_prefix}.*"])
        return {
            "type": "object",
            "propertyNames": {
                "pattern": f"^{_ENV_NAME.pattern}$",
                "not": {"pattern": f"^({reserved})$"},
            },
            "additionalProperties": self.value.schema(),
            "maxProperties": self.max_entries,
        }

    def dump(self, value: Any) -> Any:
        """Return a plain dict."""
        return {key: self.value.dump(item) for key, item in value.items()}


@dataclass(frozen=True, slots=True)
class Field:
    """One key of a record: its kind, its meaning, and its model attribute.

    ``nullable`` lets ``key: ~`` mean "not set"; it is implied for fields
    whose model default is ``None``.
    """

    key: str
    kind: Kind
    description: str
    required: bool = False
    attr: str = ""
    nullable: bool = False

    @property
    def name(self) -> str:
        """The model attribute this field fills."""
        return self.attr or self.key


class Rule(Protocol):
    """A check across fields of one record, with its JSON Schema twin."""

    def check(self, values: dict[str, Any], path: str, r: Reader) -> None:
        """Report a problem in ``values`` (already read fields) if any."""

    def schema(self) -> dict[str, Any]:
        """Return the JSON Schema expressing the same rule."""


@dataclass(frozen=True, slots=True)
class OnlyWhen:
    """``field`` may be set only when ``other`` equals ``value``."""

    field: str
    other: str
    value: str

    def check(self, values: dict[str, Any], path: str, r: Reader) -> None:
        """Report ``field`` set while ``other`` is something else."""
        if values.get(self.field) is None or self.other not in values:
            return
        if values[self.other] != self.value:
            r.error_on(
                join(path, self.field),
                f"{self.field} is only valid with {self.other} {self.value!r} "
                f"(this rule's {self.other} is {values[self.other]!r})",
            )

    def schema(self) -> dict[str, Any]:
        """``if other == value then anything else field must be null``."""
        return {
            "if": {"properties": {self.other: {"const": self.value}}, "required": [self.other]},
            "else": {"properties": {self.field: {"type": "null"}}},
        }


_MISSING: Any = dataclasses.MISSING


def _model_default(model: type[Any], attr: str) -> Any:
    for spec in msgspec.structs.fields(model):
        if spec.name == attr:
            if spec.default is not msgspec.NODEFAULT:
                return spec.default
            if spec.default_factory is not msgspec.NODEFAULT:
                return spec.default_factory()
    return _MISSING


class Record:
    """A mapping whose keys are ``fields``, built into the ``model`` dataclass."""

    def __init__(
        self,
        model: type[Any],
        fields: tuple[Field, ...],
        *,
        description: str,
        rules: tuple[Rule, ...] = (),
    ) -> None:
        self.model = model
        self.fields = fields
        self.description = description
        self.rules = rules
        self._by_key = {field.key: field for field in fields}
        self._defaults = {field.name: _model_default(model, field.name) for field in fields}

    def nullable(self, field: Field) -> bool:
        """Whether ``key: ~`` is accepted for ``field`` (meaning: its default)."""
        return field.nullable or (not field.required and self._defaults[field.name] is None)

    def read(self, node: Node, path: str, r: Reader, name: str | None = None) -> Any:
        """Return the built model object, or ``INVALID`` when a required field is unusable."""
        values = self.read_values(node, path, r)
        if values is INVALID or any(f.required and f.name not in values for f in self.fields):
            return INVALID
        if name is not None:
            values["name"] = name
        built = self.model(**values)
        r.origins[id(built)] = path
        return built

    def read_values(self, node: Node, path: str, r: Reader) -> Any:
        """Return the readable fields as ``{attr: value}``, or ``INVALID`` for a non-mapping."""
        if not r.mapping(node, path):
            return INVALID
        values: dict[str, Any] = {}
        present: set[str] = set()
        for key, key_node, value_node in r.pairs(node, path):
            child = join(path, key)
            r.lines[child] = line_of(key_node) or 0
            field = self._by_key.get(key)
            if field is None:
                r.error_at(key_node, child, self._unknown_key(key))
                continue
            present.add(key)
            if is_null(value_node) and self.nullable(field):
                continue
            value = field.kind.read(value_node, child, r)
            if value is not INVALID:
                values[field.name] = value
        for field in self.fields:
            if field.required and field.key not in present:
                line = r.lines.get(path) or line_of(node)
                r.error(line, path, f"missing required field {field.key!r}")
        for rule in self.rules:
            rule.check(values, path, r)
        return values

    def _unknown_key(self, key: str) -> str:
        known = [field.key for field in self.fields]
        hint = suggest(key, known) or f" (allowed: {', '.join(known)})"
        return f"unknown key {key!r}{hint}"

    def schema(self) -> dict[str, Any]:
        """A closed JSON object with one described property per field."""
        properties = {field.key: self._field_schema(field) for field in self.fields}
        schema: dict[str, Any] = {
            "type": "object",
            "description": self.description,
            "additionalProperties": False,
            "properties": properties,
        }
        required = [field.key for field in self.fields if field.required]
        if required:
            schema["required"] = required
        if self.rules:
            schema["allOf"] = [rule.schema() for rule in self.rules]
        return schema

    def _field_schema(self, field: Field) -> dict[str, Any]:
        kind_schema = field.kind.schema()
        if self.nullable(field):
            schema: dict[str, Any] = {"anyOf": [kind_schema, {"type": "null"}]}
        else:
            schema = dict(kind_schema)
        schema["description"] = field.description
        default = self._defaults[field.name]
        if not field.required and default is not _MISSING:
            schema["default"] = None if default is None else field.kind.dump(default)
        return schema

    def dump(self, value: Any) -> Any:
        """Return every field of the model object under its YAML key."""
        result: dict[str, Any] = {}
        for field in self.fields:
            item = getattr(value, field.name)
            result[field.key] = None if item is None else field.kind.dump(item)
        return result


class NameMap:
    """A mapping of names (validated like host/job names) to records."""

    def __init__(self, record: Record, what: str, *, max_entries: int) -> None:
        self.record = record
        self.what = what
        self.max_entries = max_entries

    def read(self, node: Node, path: str, r: Reader) -> Any:
        """Return ``{name: model}`` for the readable entries, or ``INVALID``."""
        if not r.mapping(node, path, f"a mapping of {self.what} names"):
            return INVALID
        if not _within(node, path, r, self.max_entries, f"{self.what}s"):
            return INVALID
        result: dict[str, Any] = {}
        declared = r.declared.setdefault(path, [])
        for key, key_node, value_node in r.pairs(node, path):
            child = join(path, key)
            r.lines[child] = line_of(key_node) or 0
            declared.append(key)
            problem = name_problem(key, f"{self.what} name")
            if problem is not None:
                r.error_at(key_node, child, problem)
                continue
            value = self.record.read(value_node, child, r, name=key)
            if value is not INVALID:
                result[key] = value
        return result

    def schema(self) -> dict[str, Any]:
        """A JSON object keyed by names."""
        return {
            "type": "object",
            "propertyNames": {"pattern": NAME_PATTERN},
            "additionalProperties": self.record.schema(),
            "maxProperties": self.max_entries,
        }

    def dump(self, value: Any) -> Any:
        """Return ``{name: record}``."""
        return {key: self.record.dump(item) for key, item in value.items()}
