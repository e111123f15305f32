"""Scalar kinds of the policy's field spec.

Each kind knows three things about one value: how to read it from a YAML
node (reporting problems with their line), how to describe it in JSON
Schema, and how to write it back as canonical JSON data. The loader, the
schema export and ``policy_to_dict`` all walk the same spec, so they cannot
disagree.

Values are typed strictly: a string field given ``8`` or ``yes`` is an
error with a hint to quote it, so the file means the same to this loader
as to any JSON Schema tool.
"""

from __future__ import annotations

import difflib
import math
import re
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any, Protocol

from allocator.errors import InvalidName
from allocator.policy.globs import glob_never_matches
from allocator.policy.yamlspec.reader import INVALID, Reader, describe_value, is_null, kind_of
from allocator.policy.yamlspec.scalars import parse_rfc3339
from allocator.records.keys import MAX_NAME_LENGTH, validate_name

if TYPE_CHECKING:
    from yaml.nodes import Node

__all__ = [
    "MAX_TEXT_LENGTH",
    "NAME_PATTERN",
    "Bool",
    "Const",
    "Enum",
    "Glob",
    "Int",
    "Kind",
    "Name",
    "Number",
    "Scalar",
    "Str",
    "Timestamp",
    "name_problem",
    "suggest",
]

#: JSON Schema (ECMA-262) twin of :func:`allocator.records.keys.validate_name`.
NAME_PATTERN = rf"^(?!\.\.?$)(?!-)[A-Za-z0-9._-]{{1,{MAX_NAME_LENGTH}}}$"
#: The longest string a policy field takes unless it says otherwise.
MAX_TEXT_LENGTH = 4096
_GLOB = re.compile(r"[A-Za-z0-9._*?!\[\]-]{1,128}", re.ASCII)


class Kind(Protocol):
    """What every node of the field spec can do."""

    def read(self, node: Node, path: str, r: Reader) -> Any:
        """Return the value of ``node``, or ``INVALID`` after reporting the problem."""

    def schema(self) -> dict[str, Any]:
        """Return the JSON Schema of this value."""

    def dump(self, value: Any) -> Any:
        """Return ``value`` as canonical JSON-ready data."""


def suggest(word: str, known: list[str] | tuple[str, ...]) -> str:
    """Return `` (did you mean 'x'?)`` for the closest of ``known``, or ``""``."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class Scalar:
    """A kind read from one scalar node; subclasses check the Python value."""

    expected = "a value"
    #: Whether the value is text (an ambiguous plain scalar is then told to be quoted).
    wants_text = False
    #: What the value is (``boolean``, ``number``, ``time``), for wording ambiguities.
    value_kinds: frozenset[str] = frozenset()

    def read(self, node: Node, path: str, r: Reader) -> Any:
        """Return the checked value of ``node``, or ``INVALID``."""
        if kind_of(node) != "scalar":
            got = "a list" if kind_of(node) == "sequence" else "a mapping"
            r.error_at(node, path, f"expected {self.expected}, got {got}")
            return INVALID
        value = r.scalar(node, path, self.expected, self.value_kinds, text=self.wants_text)
        if value is INVALID:
            return INVALID
        problem = self.problem(value, node)
        if problem is not None:
            r.error_at(node, path, problem)
            return INVALID
        return self.convert(value)

    def problem(self, value: Any, node: Node) -> str | None:
        """Return why ``value`` is not acceptable, or ``None``."""
        return None

    def convert(self, value: Any) -> Any:
        """Return the model's form of an acceptable value."""
        return value

    def dump(self, value: Any) -> Any:
        """Return ``value`` unchanged (it is JSON already)."""
        return value

    def wrong_type(self, value: Any, node: Node) -> str:
        """Say what was expected and what was found."""
        got = describe_value(value)
        if not is_null(node):
            shown = node.value if len(node.value) <= 40 else node.value[:37] + "..."
            got = f"{got} ({shown!r})" if isinstance(value, str) else f"{got} ({shown})"
        return f"expected {self.expected}, got {got}"


class Str(Scalar):
    """A non-empty string (``nonempty=False`` allows ``""``) of at most ``max_length``."""

    expected = "a string"
    wants_text = True

    def __init__(self, *, nonempty: bool = True, max_length: int = MAX_TEXT_LENGTH) -> None:
        self.nonempty = nonempty
        self.max_length = max_length

    def problem(self, value: Any, node: Node) -> str | None:
        """Refuse non-strings (with a quoting hint), empty or overlong strings and NUL bytes."""
        if not isinstance(value, str):
            hint = "" if is_null(node) else f"; quote it if you mean the text {node.value!r}"
            return self.wrong_type(value, node) + hint
        if self.nonempty and not value:
            return "must not be empty"
        if len(value) > self.max_length:
            return f"is {len(value):,} characters long; at most {self.max_length:,}"
        if "\0" in value:
            return "must not contain a NUL character"
        return None

    def schema(self) -> dict[str, Any]:
        """A string, non-empty unless allowed, bounded in length."""
        schema: dict[str, Any] = {"type": "string", "maxLength": self.max_length}
        if self.nonempty:
            schema["minLength"] = 1
        return schema


class Name(Str):
    """A host/job/pool/reservation/fallback name (see :func:`validate_name`)."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what
        self.expected = f"a {what} name"

    def problem(self, value: Any, node: Node) -> str | None:
        """Refuse anything :func:`allocator.records.keys.validate_name` refuses."""
        if not isinstance(value, str):
            return self.wrong_type(value, node)
        return name_problem(value, self.what)

    def schema(self) -> dict[str, Any]:
        """A string matching :data:`NAME_PATTERN`."""
        return {"type": "string", "pattern": NAME_PATTERN}


def name_problem(value: str, what: str) -> str | None:
    """Return why ``value`` is not a valid name, or ``None``."""
    try:
        validate_name(value, what)
    except InvalidName as exc:
        return str(exc)
    return None


class Glob(Str):
    """A job-name glob (``eval-*``, ``train-[ab]``)."""

    expected = "a job name glob"

    def problem(self, value: Any, node: Node) -> str | None:
        """Refuse anything but name characters and ``* ? [ ] !``."""
        if not isinstance(value, str):
            return self.wrong_type(value, node)
        if not _GLOB.fullmatch(value):
            return (
                f"job glob {value!r} may contain only letters, digits, '.', '_', '-' "
                "and the wildcards * ? [ ] !"
            )
        never = glob_never_matches(value)
        if never is not None:
            return f"job glob {value!r} can never match a job name: {never}"
        return None

    def schema(self) -> dict[str, Any]:
        """A string of name characters and wildcards."""
        return {"type": "string", "pattern": f"^{_GLOB.pattern}$"}


class Bool(Scalar):
    """``true`` or ``false``."""

    expected = "a boolean (true or false)"
    value_kinds = frozenset({"boolean"})

    def problem(self, value: Any, node: Node) -> str | None:
        """Refuse anything but a boolean."""
        return None if isinstance(value, bool) else self.wrong_type(value, node)

    def schema(self) -> dict[str, Any]:
        """A JSON boolean."""
        return {"type": "boolean"}


class Int(Scalar):
    """An integer between ``minimum`` and ``maximum`` (both inclusive)."""

    expected = "an integer"
    value_kinds = frozenset({"number"})

    def __init__(self, *, minimum: int, maximum: int, why: str = "") -> None:
        self.minimum = minimum
        self.maximum = maximum
        self.why = why

    def problem(self, value: Any, node: Node) -> str | None:
        """Refuse non-integers (booleans included) and values out of range."""
        if isinstance(value, bool) or not isinstance(value, int):
            return self.wrong_type(value, node)
        if value < self.minimum:
            return f"must be >= {self.minimum}, got {value}"
        if value > self.maximum:
            why = f" ({self.why})" if self.why else ""
            return f"must be <= {self.maximum:,}{why}, got {value:,}"
        return None

    def schema(self) -> dict[str, Any]:
        """A JSON integer with its bounds."""
        return {"type": "integer", "minimum": self.minimum, "maximum": self.maximum}


class Number(Scalar):
    """A finite number (integers accepted) read as a float, within its bounds."""

    expected = "a number"
    value_kinds = frozenset({"number"})

    def __init__(
        self,
        *,
        maximum: float,
        minimum: float | None = None,
        above: float | None = None,
        why: str = "",
    ) -> None:
        self.minimum = minimum
        self.above = above
        self.maximum = maximum
        self.why = why

    def problem(self, value: Any, node: Node) -> str | None:
        """Refuse non-numbers, infinities, NaN and values out of bounds."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return self.wrong_type(value, node)
        if not math.isfinite(value):
            return f"must be a finite number, got {node.value}"
        if self.minimum is not None and value < self.minimum:
            return f"must be >= {self.minimum:g}, got {value:g}"
        if self.above is not None and value <= self.above:
            return f"must be > {self.above:g}, got {value:g}"
        if value > self.maximum:
            why = f" ({self.why})" if self.why else ""
            return f"must be <= {self.maximum:g}{why}, got {value:g}"
        return None

    def convert(self, value: Any) -> float:
        """Return the number as a float."""
        return float(value)

    def schema(self) -> dict[str, Any]:
        """A JSON number with its bounds."""
        schema: dict[str, Any] = {"type": "number", "maximum": self.maximum}
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        if self.above is not None:
            schema["exclusiveMinimum"] = self.above
        return schema


class Enum(Scalar):
    """One of a fixed set of strings."""

    wants_text = True

    def __init__(self, *choices: str) -> None:
        self.choices = choices
        self.expected = "one of " + ", ".join(choices)

    def problem(self, value: Any, node: Node) -> str | None:
        """Refuse anything outside the choices, suggesting the closest."""
        if isinstance(value, str) and value in self.choices:
            return None
        hint = suggest(value, self.choices) if isinstance(value, str) else ""
        return self.wrong_type(value, node) + hint

    def schema(self) -> dict[str, Any]:
        """A JSON enum."""
        return {"type": "string", "enum": list(self.choices)}


class Const(Scalar):
    """Exactly one integer value (the policy format ``version``)."""

    value_kinds = frozenset({"number"})

    def __init__(self, value: int) -> None:
        self.value = value
        self.expected = f"{value}"

    def problem(self, value: Any, node: Node) -> str | None:
        """Refuse any other value."""
        if isinstance(value, int) and not isinstance(value, bool) and value == self.value:
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            return f"unsupported policy version {value} (this allocator reads version {self.value})"
        return self.wrong_type(value, node)

    def schema(self) -> dict[str, Any]:
        """A JSON const."""
        return {"const": self.value}


class Timestamp(Scalar):
    """A timezone-aware instant: a YAML timestamp or an ISO 8601 string.

    A time without a timezone is refused rather than guessed: a reservation
    window read in the wrong zone frees or takes GPUs hours off. Read values
    are converted to UTC.
    """

    expected = "an RFC 3339 time with a timezone, like 2027-01-01T00:00:00Z"
    value_kinds = frozenset({"time"})

    def read(self, node: Node, path: str, r: Reader) -> Any:
        """Return the instant in UTC, or ``INVALID``."""
        value = super().read(node, path, r)
        if value is INVALID:
            return INVALID
        try:
            return value.astimezone(UTC)
        except (OverflowError, ValueError):
            r.error_at(node, path, f"timestamp {node.value!r} is out of range")
            return INVALID

    def problem(self, value: Any, node: Node) -> str | None:
        """Refuse non-timestamps, dates without a time and times without a zone."""
        try:
            instant = _as_datetime(value)
        except ValueError as exc:
            return str(exc)
        if instant is None:
            if isinstance(value, date):
                return f"expected {self.expected}, got a date without a time ({node.value})"
            return self.wrong_type(value, node)
        if instant.utcoffset() is None:
            return (
                f"timestamp {node.value!r} has no timezone; add Z for UTC or an offset like +02:00"
            )
        return None

    def convert(self, value: Any) -> datetime | None:
        """Return the parsed instant."""
        return _as_datetime(value)

    def schema(self) -> dict[str, Any]:
        """A date-time string."""
        return {"type": "string", "format": "date-time"}

    def dump(self, value: Any) -> Any:
        """Return ISO 8601 in UTC with a ``Z``."""
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _as_datetime(value: Any) -> datetime | None:
    """The instant ``value`` is (a read timestamp, or RFC 3339 text); ``ValueError`` if none."""
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        return parse_rfc3339(value)
    return None
