"""The state of one policy load: collected problems, field lines, mapping pairs.

Nothing here imports PyYAML: nodes are handled by their ``id`` attribute
(``"scalar"``, ``"sequence"``, ``"mapping"``), and scalars are turned into
Python values by a ``construct`` function handed in by
:mod:`allocator.policy.yamlspec.document`, the one module that imports PyYAML.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from allocator.errors import PolicyError
from allocator.policy.yamlspec.scalars import NULL_TAG, AmbiguousScalar
from allocator.util.printable import printable

if TYPE_CHECKING:
    from yaml.nodes import Node

__all__ = [
    "INVALID",
    "MAP_TAG",
    "MERGE_TAG",
    "NULL_TAG",
    "SEQ_TAG",
    "Pair",
    "Reader",
    "describe_node",
    "describe_value",
    "is_null",
    "join",
    "kind_of",
    "line_of",
]

MERGE_TAG: Final = "tag:yaml.org,2002:merge"
MAP_TAG: Final = "tag:yaml.org,2002:map"
SEQ_TAG: Final = "tag:yaml.org,2002:seq"

Pair = tuple[str, "Node", "Node"]


class _Invalid:
    """Marker for a value that could not be read (its problem is already reported)."""

    def __repr__(self) -> str:
        return "INVALID"


INVALID: Final = _Invalid()


def kind_of(node: Node) -> str:
    """Return ``"scalar"``, ``"sequence"`` or ``"mapping"`` (PyYAML's node ``id``)."""
    return str(getattr(node, "id", ""))


def line_of(node: Node) -> int | None:
    """Return the 1-based line where ``node`` starts, if known."""
    mark = node.start_mark
    return None if mark is None else mark.line + 1


def join(path: str, key: str) -> str:
    """Return the dotted field path of ``key`` under ``path`` (odd keys quoted: ``a['']``)."""
    if not key or not key.isprintable():
        return f"{path}[{key!r}]"
    return f"{path}.{key}" if path else key


def is_null(node: Node) -> bool:
    """Whether ``node`` is a YAML null (``~``, ``null`` or nothing at all)."""
    return bool(kind_of(node) == "scalar" and node.tag == NULL_TAG)


def describe_value(value: object) -> str:
    """Name the type of a read YAML value the way a policy author thinks of it."""
    from datetime import date, datetime

    if value is None:
        return "null"
    # The first that fits: a bool is an int, a datetime a date.
    names = (
        (bool, "a boolean"),
        (int, "an integer"),
        (float, "a number"),
        (str, "a string"),
        (datetime, "a timestamp"),
        (date, "a date"),
        (bytes, "binary data"),
    )
    return next((name for kind, name in names if isinstance(value, kind)), type(value).__name__)


def describe_node(node: Node) -> str:
    """Name what a non-scalar node is (``a list``/``a mapping``)."""
    return {"sequence": "a list", "mapping": "a mapping"}.get(kind_of(node), "a value")


class Reader:
    """Collects every problem of one load, and the line of every field read.

    ``lines`` maps a field path (``jobs.train.fallback``) to the line it was
    written on, so cross-reference checks, which run after the walk, can
    still point at the right line; ``origins`` gives the path each model
    object was read from and ``item_paths`` the path of each list item kept
    (items that failed are skipped, so indices alone would not tell).
    ``declared`` keeps every key of each name map, valid or not, so one bad
    entry does not cause a second error wherever it is referenced.
    """

    def __init__(self, source: str, construct: Callable[[Node], Any]) -> None:
        self.source = source
        self._construct = construct
        self.errors: list[PolicyError] = []
        self.lines: dict[str, int] = {}
        self.declared: dict[str, list[str]] = {}
        self.origins: dict[int, str] = {}  # id of each built model object -> its path
        self.item_paths: dict[str, list[str]] = {}  # list path -> path of each item kept
        self._pairs: dict[int, list[Pair]] = {}

    def error(self, line: int | None, field: str | None, reason: str) -> None:
        """Record one problem."""
        self.errors.append(
            PolicyError(
                printable(reason),
                file=self.source,
                line=line,
                field=printable(field) if field else None,
            )
        )

    def error_at(self, node: Node, field: str | None, reason: str) -> None:
        """Record one problem at ``node``'s line."""
        self.error(line_of(node), field, reason)

    def error_on(self, path: str, reason: str) -> None:
        """Record one problem on an already-read field, at the line it was written on."""
        self.error(self.lines.get(path), path, reason)

    def item_path(self, path: str, index: int) -> str:
        """Return where the ``index``-th kept item of the list at ``path`` was written."""
        kept = self.item_paths.get(path, [])
        return kept[index] if index < len(kept) else f"{path}[{index}]"

    def scalar(
        self,
        node: Node,
        path: str,
        expected: str = "a value",
        kinds: frozenset[str] = frozenset(),
        *,
        text: bool = False,
    ) -> Any:
        """Return the Python value of a scalar node, or ``INVALID`` after reporting why.

        An ambiguous plain scalar (``010``, ``yes``) is reported for the field
        at hand: one wanting ``text`` says to quote it, one whose value
        ``kinds`` include what it looks like says how to write that value.
        """
        try:
            return self._construct(node)
        except AmbiguousScalar as exc:
            self.error_at(node, path, exc.for_field(expected, kinds, text))
            return INVALID
        except ValueError as exc:
            self.error_at(node, path, str(exc))
            return INVALID

    def mapping(self, node: Node, path: str, expected: str = "a mapping") -> bool:
        """Whether ``node`` is a plain mapping; reports the problem when it is not."""
        return self._collection(node, path, expected, "mapping", MAP_TAG, "a mapping")

    def sequence(self, node: Node, path: str, expected: str = "a list") -> bool:
        """Whether ``node`` is a plain list; reports the problem when it is not."""
        return self._collection(node, path, expected, "sequence", SEQ_TAG, "a list")

    def _collection(
        self, node: Node, path: str, expected: str, kind: str, tag: str, plain: str
    ) -> bool:
        """Whether ``node`` is a ``kind`` with its plain ``tag``; reports the problem when not."""
        if kind_of(node) != kind:
            self.error_at(node, path, f"expected {expected}, got {self._describe(node)}")
            return False
        if node.tag != tag:
            self.error_at(node, path, f"unsupported tag {node.tag!r} on {plain}")
            return False
        return True

    def _describe(self, node: Node) -> str:
        if kind_of(node) != "scalar":
            return describe_node(node)
        if is_null(node):
            return "null"
        try:
            value = self._construct(node)
        except ValueError:
            return "a value"
        text = f" ({node.value!r})" if isinstance(value, str) and len(node.value) <= 40 else ""
        return describe_value(value) + text

    def pairs(self, node: Node, path: str) -> list[Pair]:
        """Return a mapping's ``(key, key_node, value_node)`` triples.

        Keys are the scalars' text, as JSON would have them. Duplicate keys
        are refused (PyYAML would silently keep the last one); ``<<`` merge
        keys are expanded, explicit keys winning over merged ones.
        """
        cached = self._pairs.get(id(node))
        if cached is not None:
            return cached
        self._pairs[id(node)] = []  # a mapping that merges itself sees nothing
        explicit: dict[str, Pair] = {}
        merged: list[Pair] = []
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_TAG:
                merged.extend(self._merge_sources(value_node, path))
            elif kind_of(key_node) != "scalar":
                self.error_at(
                    key_node, path, f"mapping keys must be strings, got {describe_node(key_node)}"
                )
            elif str(key_node.value) in explicit:
                key = str(key_node.value)
                first = line_of(explicit[key][1])
                self.error_at(
                    key_node, join(path, key), f"duplicate key {key!r} (first at line {first})"
                )
            else:
                explicit[str(key_node.value)] = (str(key_node.value), key_node, value_node)
        result = list(explicit.values())
        for pair in merged:
            if pair[0] not in explicit:
                explicit[pair[0]] = pair
                result.append(pair)
        self._pairs[id(node)] = result
        return result

    def _merge_sources(self, node: Node, path: str) -> list[Pair]:
        sources = node.value if kind_of(node) == "sequence" else [node]
        pairs: list[Pair] = []
        seen: set[str] = set()
        for source in sources:
            if kind_of(source) != "mapping":
                self.error_at(source, path, "'<<' must merge a mapping or a list of mappings")
                continue
            for pair in self.pairs(source, path):
                # YAML merge: of several merged mappings, the first one listed wins
                if pair[0] not in seen:
                    seen.add(pair[0])
                    pairs.append(pair)
        return pairs
