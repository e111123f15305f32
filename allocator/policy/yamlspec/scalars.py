"""How a scalar's text becomes a value: only what YAML 1.1, YAML 1.2 and JSON agree on.

PyYAML reads YAML 1.1, where ``010`` is 8, ``1_0`` is 10, ``1:30`` is 90,
``0b11`` is 3 and ``yes`` is true; editors, JSON Schema tools and YAML 1.2
libraries read the same text as 10, text, text, text and text. A policy must
mean one thing to every tool that reads it, so a plain (unquoted) scalar is
accepted only in a form they all read alike:

* integers: plain decimal, an optional leading minus, no leading zeros;
* numbers: JSON numbers (``0.5``, ``1e3``, ``-2.5E-3``), and ``.inf``/``.nan``
  (which number fields then refuse as not finite);
* booleans: ``true`` and ``false``;
* null: nothing, ``~`` or ``null``;
* times: RFC 3339 (``2027-01-01T00:00:00Z``); a bare date is still read as a
  date so that fields can say what is missing.

Anything else a YAML 1.1 or 1.2 reader would turn into a number, boolean or
time is refused by :class:`AmbiguousScalar` saying how to write it. All
other plain text is a string. Quoted scalars are always strings. This module
is pure: the PyYAML glue is in :mod:`allocator.policy.yamlspec.document`.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Final

__all__ = [
    "AMBIGUOUS_TAG",
    "BOOL_TAG",
    "FLOAT_TAG",
    "INT_TAG",
    "MAX_NUMBER_LENGTH",
    "NULL_TAG",
    "STR_TAG",
    "TIMESTAMP_TAG",
    "AmbiguousScalar",
    "ambiguity",
    "parse_rfc3339",
    "plain_tag",
    "read_tagged",
]

NULL_TAG: Final = "tag:yaml.org,2002:null"
BOOL_TAG: Final = "tag:yaml.org,2002:bool"
INT_TAG: Final = "tag:yaml.org,2002:int"
FLOAT_TAG: Final = "tag:yaml.org,2002:float"
STR_TAG: Final = "tag:yaml.org,2002:str"
TIMESTAMP_TAG: Final = "tag:yaml.org,2002:timestamp"
#: The tag of a plain scalar the tools read differently (see :func:`plain_tag`).
AMBIGUOUS_TAG: Final = "tag:allocator,2027:ambiguous"

#: Longer numerals are refused before conversion (Python's ``int()`` refuses
#: over 4,300 digits, and no field takes a number near this long anyway).
MAX_NUMBER_LENGTH: Final = 40

_NULLS = frozenset({"", "~", "null", "Null", "NULL"})
_INT = re.compile(r"-?(?:0|[1-9][0-9]*)", re.ASCII)
_JSON_FLOAT = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?", re.ASCII)
_SPECIAL_FLOATS = {
    ".inf": float("inf"),
    ".Inf": float("inf"),
    ".INF": float("inf"),
    "+.inf": float("inf"),
    "+.Inf": float("inf"),
    "+.INF": float("inf"),
    "-.inf": float("-inf"),
    "-.Inf": float("-inf"),
    "-.INF": float("-inf"),
    ".nan": float("nan"),
    ".NaN": float("nan"),
    ".NAN": float("nan"),
}
_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})", re.ASCII)
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?"
    r"([Zz]|[-+][0-9]{2}:[0-9]{2})?",
    re.ASCII,
)
# What YAML 1.1 readers (PyYAML, SnakeYAML, Psych) read as something other than text.
_YAML11_TRUE = frozenset(["yes", "Yes", "YES", "on", "On", "ON", "True", "TRUE"])
_YAML11_FALSE = frozenset(["no", "No", "NO", "off", "Off", "OFF", "False", "FALSE"])
_YAML11_TIMESTAMP = re.compile(
    r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}(?:[Tt]|[ \t]+)[0-9]{1,2}:[0-9]{2}:[0-9]{2}"
    r"(?:\.[0-9]*)?(?:[ \t]*(?:Z|[-+][0-9]{1,2}(?::[0-9]{2})?))?",
    re.ASCII,
)
_WORDS = _NULLS | _YAML11_TRUE | _YAML11_FALSE | {"true", "false"}
# Every number, time or special float starts with one of these.
_MAYBE_NOT_TEXT = frozenset("-+.0123456789")
_SIGN = r"[-+]?"
_LEADING_ZERO = re.compile(_SIGN + r"0[0-9_]+", re.ASCII)
_HEX = re.compile(_SIGN + r"0x[0-9a-fA-F_]+", re.ASCII)
_OCTAL_12 = re.compile(r"0o[0-7]+", re.ASCII)
_BINARY = re.compile(_SIGN + r"0b[01_]+", re.ASCII)
_UNDERSCORED = re.compile(_SIGN + r"[0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][-+][0-9]+)?", re.ASCII)
_SEXAGESIMAL = re.compile(_SIGN + r"[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?", re.ASCII)
_OTHER_FLOAT = re.compile(_SIGN + r"(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?", re.ASCII)


class AmbiguousScalar(ValueError):
    """A plain scalar the tools read differently, or that JSON cannot say as written.

    ``problem`` says what is wrong with ``text``, ``rewrite`` how to write
    the value meant, and ``kind`` what some tool reads it as (``boolean``,
    ``number`` or ``time``); :meth:`for_field` words it for the field at hand.
    """

    def __init__(self, text: str, problem: str, rewrite: str, kind: str) -> None:
        self.text = text
        self.problem = problem
        self.rewrite = rewrite
        self.kind = kind
        super().__init__(f"{_shown(text)} {problem}; write {rewrite}")

    def for_field(self, expected: str, kinds: frozenset[str], text: bool) -> str:
        """The message for a field expecting ``expected`` (values of ``kinds``, or ``text``)."""
        shown = _shown(self.text)
        if text:
            return f"{shown} {self.problem}; quote it ('{shown}') if you mean the text"
        if self.kind in kinds:
            return str(self)
        return f"expected {expected}, got {shown}, which {self.problem}"


def _shown(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."


def plain_tag(text: str) -> str:
    """The tag of a plain, untagged scalar: a core tag, ``STR_TAG`` or ``AMBIGUOUS_TAG``."""
    if text and text[0] not in _MAYBE_NOT_TEXT and text not in _WORDS:
        return STR_TAG  # most scalars: words that no rule below can match
    if text in _NULLS:
        return NULL_TAG
    if text in ("true", "false"):
        return BOOL_TAG
    if _INT.fullmatch(text):
        return INT_TAG
    if _JSON_FLOAT.fullmatch(text) or text in _SPECIAL_FLOATS:
        return FLOAT_TAG
    if _DATE.fullmatch(text) or _RFC3339.fullmatch(text):
        return TIMESTAMP_TAG
    if ambiguity(text) is not None:
        return AMBIGUOUS_TAG
    return STR_TAG


def read_tagged(tag: str, text: str) -> object:
    """The value of ``text`` under a core ``tag`` (resolved or written), or ``ValueError``."""
    if tag == STR_TAG:
        return text
    if tag == NULL_TAG:
        if text not in _NULLS:
            raise ValueError(f"{_shown(text)!r} is not null (write ~ or null)")
        return None
    if tag == AMBIGUOUS_TAG:
        raise _ambiguous(text)
    reader = _READERS.get(tag)
    if reader is None:
        raise LookupError(tag)
    return reader(text)


def _read_bool(text: str) -> bool:
    if text in ("true", "false"):
        return text == "true"
    raise _ambiguous(text, ("is not a boolean", "true or false", "boolean"))


def _read_int(text: str) -> int:
    if not _INT.fullmatch(text):
        raise _ambiguous(text, ("is not a plain decimal integer", "a number like 10", "number"))
    if len(text) > MAX_NUMBER_LENGTH:
        raise ValueError(f"a {len(text.lstrip('-'))}-digit number is out of range")
    return int(text)


def _read_float(text: str) -> float:
    if text in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[text]
    if not _JSON_FLOAT.fullmatch(text):
        raise _ambiguous(text, ("is not a plain number", "a number like 2.5", "number"))
    return float(text)


def _read_timestamp(text: str) -> datetime | date:
    instant = parse_rfc3339(text)
    if instant is not None:
        return instant
    found = _DATE.fullmatch(text)
    if found is not None:
        try:
            return date(*(int(part) for part in found.groups()))
        except ValueError as exc:
            raise ValueError(f"{_shown(text)!r} is not a valid date: {exc}") from None
    raise _ambiguous(text, ("is not an RFC 3339 time", "2027-01-01T00:00:00Z", "time"))


_READERS = {
    BOOL_TAG: _read_bool,
    INT_TAG: _read_int,
    FLOAT_TAG: _read_float,
    TIMESTAMP_TAG: _read_timestamp,
}


def parse_rfc3339(text: str) -> datetime | None:
    """Parse an RFC 3339 date-time (``T`` between date and time, ``Z`` or ``±HH:MM``).

    Returns ``None`` for anything else (week dates, ordinal dates, basic
    format, a space for ``T``: Python's ``fromisoformat`` takes them all, JSON
    Schema's ``date-time`` does not). A time without an offset comes back
    naive, so callers can say the zone is missing. Raises ``ValueError`` for
    a well-formed but impossible time (month 13, second 61, year 0).
    """
    found = _RFC3339.fullmatch(text)
    if found is None:
        return None
    year, month, day, hour, minute, second, fraction, offset = found.groups()
    zone = None if offset is None else _zone(offset, text)
    micro = int((fraction or ".0")[1:7].ljust(6, "0"))
    try:
        return datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second), micro, zone
        )
    except ValueError as exc:
        raise ValueError(f"{_shown(text)!r} is not a valid time: {exc}") from None


def _zone(offset: str, text: str) -> timezone:
    if offset in ("Z", "z"):
        return UTC
    hours, minutes = int(offset[1:3]), int(offset[4:6])
    if hours > 23 or minutes > 59:
        raise ValueError(f"{_shown(text)!r} has an impossible UTC offset {offset}")
    delta = timedelta(hours=hours, minutes=minutes)
    return timezone(-delta if offset[0] == "-" else delta)


def ambiguity(text: str) -> tuple[str, str, str] | None:
    """Why a plain scalar is not read as text, and how to write the value; ``None`` if it is text.

    Covers what YAML 1.1 (PyYAML) reads as a boolean, an integer in another
    base or with separators, a base-60 number or a loose timestamp, and what
    YAML 1.2 reads as a number that JSON cannot spell as written.
    """
    if text in _YAML11_TRUE or text in _YAML11_FALSE:
        meant = "true" if text in _YAML11_TRUE else "false"
        if text.lower() == meant:
            return "is not a boolean as JSON writes it", meant, "boolean"
        problem = f"is ambiguous (YAML 1.1 reads it as {meant}, YAML 1.2 as text)"
        return problem, f"true or false, not {text}", "boolean"
    for check in (_integer_ambiguity, _float_ambiguity, _timestamp_ambiguity):
        found = check(text)
        if found is not None:
            return found
    return None


def _integer_ambiguity(text: str) -> tuple[str, str, str] | None:
    sign = "-" if text.startswith("-") else ""
    body = text.lstrip("+-")
    if _LEADING_ZERO.fullmatch(text):
        digits = body.replace("_", "")
        decimal = _int_words(sign + digits)
        if set(digits) <= set("01234567"):  # YAML 1.1 reads 0_10 as octal too
            octal = int(digits, 8)
            problem = f"is ambiguous (YAML 1.1 reads it as octal {sign}{octal})"
            return problem, decimal, "number"
        if "_" not in body:
            return "is ambiguous (YAML 1.1 reads it as text)", decimal, "number"
        # Text to both YAMLs, but no field wants it as text: refused, saying the number.
        return "is not a number as JSON writes it", decimal, "number"
    if _HEX.fullmatch(text):
        value = _safe_int(body[2:].replace("_", ""), 16)
        return "is hexadecimal, which JSON cannot write", f"{sign}{value}", "number"
    if _OCTAL_12.fullmatch(text):
        value = _safe_int(body[2:], 8)
        problem = f"is ambiguous (YAML 1.2 reads it as octal {value}, YAML 1.1 as text)"
        return problem, value, "number"
    if _BINARY.fullmatch(text):
        value = _safe_int(body[2:].replace("_", "") or "0", 2)
        problem = f"is ambiguous (YAML 1.1 reads it as binary {sign}{value})"
        return problem, f"{sign}{value}", "number"
    if _SEXAGESIMAL.fullmatch(text):
        value = _sexagesimal(body)
        problem = f"is ambiguous (YAML 1.1 reads it as {sign}{value}, base 60; YAML 1.2 as text)"
        return problem, f"{sign}{value}", "number"
    return None


def _float_ambiguity(text: str) -> tuple[str, str, str] | None:
    if "_" in text and _UNDERSCORED.fullmatch(text):
        cleaned = text.replace("_", "").lstrip("+")
        problem = f"is ambiguous (YAML 1.1 reads it as {_shown(cleaned)}, YAML 1.2 as text)"
        return problem, _shown(cleaned), "number"
    if text.startswith("+") and (_INT.fullmatch(text[1:]) or _JSON_FLOAT.fullmatch(text[1:])):
        return "has a leading +, which JSON does not allow", _shown(text[1:]), "number"
    if _OTHER_FLOAT.fullmatch(text) and len(text) <= MAX_NUMBER_LENGTH:
        return "is not a number as JSON writes it", repr(float(text)), "number"
    return None


def _timestamp_ambiguity(text: str) -> tuple[str, str, str] | None:
    if _YAML11_TIMESTAMP.fullmatch(text):
        problem = "is ambiguous (YAML 1.1 reads it as a timestamp, YAML 1.2 as text)"
        return problem, "an RFC 3339 time like 2027-01-01T00:00:00Z", "time"
    return None


def _ambiguous(text: str, fallback: tuple[str, str, str] | None = None) -> AmbiguousScalar:
    found = ambiguity(text) or fallback or ("is not a plain value", "it in quotes", "text")
    return AmbiguousScalar(text, *found)


def _int_words(text: str) -> str:
    sign = "-" if text.startswith("-") else ""
    return sign + (text.lstrip("+-").lstrip("0") or "0")


def _safe_int(digits: str, base: int) -> str:
    if len(digits) > MAX_NUMBER_LENGTH:
        return "a number too large to read"
    return str(int(digits, base))


def _sexagesimal(body: str) -> str:
    whole, _, fraction = body.partition(".")
    value = 0
    for part in whole.replace("_", "").split(":"):
        if len(part) > MAX_NUMBER_LENGTH:
            return "a number too large to read"
        value = value * 60 + int(part)
    return f"{value}.{fraction.replace('_', '')}" if fraction else str(value)
