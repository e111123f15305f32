"""Store URLs: which backend a URL names, SQLite's path and options, and redaction.

Every place that prints or logs a store URL goes through :func:`redact_url`
(one URL) or :func:`redact_urls` (free text that may hold URLs), so a
password typed as ``etcd://user:password@host`` or a ``?token=`` never
reaches a terminal, a log or an error message. Redaction works on text, not
on a parsed URL: a malformed URL (the kind that ends up in an error
message) is redacted just as well as a good one.

Pure: no I/O, no client library.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, unquote

from allocator.errors import StoreConfigError

__all__ = [
    "MAX_URL_LENGTH",
    "SCHEMES",
    "SQLITE_MODES",
    "SqliteUrl",
    "parse_sqlite_url",
    "redact_url",
    "redact_urls",
    "scheme_of",
    "url_secrets",
]

#: The schemes :func:`allocator.store.open_store` knows.
SCHEMES = ("consul", "consuls", "etcd", "etcds", "memory", "sqlite")
#: Longer than any real URL; a longer one is refused before it is parsed.
MAX_URL_LENGTH = 4096
#: SQLite URL modes (SQLite's own URI vocabulary): read-only; read-write but
#: never create; read-write, creating the file on the first write.
SQLITE_MODES = ("ro", "rw", "rwc")

_MASK = "***"
# Query parameters whose value is a secret (matched case-insensitively, as a substring).
_SECRET_PARAMS = ("password", "passwd", "pwd", "token", "secret", "auth")
# A URL inside free text: a scheme, "://", then everything up to white space or a quote.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>]*")


def scheme_of(url: str) -> str:
    """The scheme of ``url`` if allocator knows it; ``StoreConfigError`` otherwise.

    The error shows the URL redacted, and lists the schemes that work.
    """
    if not isinstance(url, str) or not url:
        raise StoreConfigError("the store URL is empty (use --store or ALLOCATOR_STORE)")
    if len(url) > MAX_URL_LENGTH:
        raise StoreConfigError(
            f"the store URL is {len(url)} characters long; at most {MAX_URL_LENGTH}"
        )
    scheme, sep, _ = url.partition("://")
    if sep and scheme in SCHEMES:
        return scheme
    known = ", ".join(f"{s}://" for s in SCHEMES)
    shown = _shorten(redact_url(url))
    raise StoreConfigError(f"unknown store URL {shown!r}: expected one of {known}")


def redact_url(url: str) -> str:
    """``url`` with its password and secret query values replaced by ``***``.

    ``scheme://user:secret@host/?token=t&timeout=3`` becomes
    ``scheme://user:***@host/?token=***&timeout=3``. A user name before a
    ``:`` is kept (it helps to say who was refused); everything between the
    first ``:`` of the user part and the last ``@`` is masked, so a password
    holding ``@``, ``/`` or ``?`` is masked whole. A user part without ``:``
    is masked whole (``https://TOKEN@host`` is a common way to pass a token).
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return _redact_query(url)
    userinfo, at, tail = rest.rpartition("@")
    if at and ":" in userinfo:
        rest = f"{userinfo.partition(':')[0]}:{_MASK}@{tail}"
    elif at:
        rest = f"{_MASK}@{tail}"
    return f"{scheme}://{_redact_query(rest)}"


def redact_urls(text: str) -> str:
    """``text`` with every URL in it redacted (see :func:`redact_url`)."""
    if "://" not in text and "=" not in text:
        return text
    return _URL_IN_TEXT.sub(lambda found: redact_url(found.group(0)), text)


def url_secrets(url: str) -> tuple[str, ...]:
    """The secrets ``url`` carries: its password and secret query values, as typed and decoded.

    Used to keep them out of logs and worker environments even where they
    appear outside a URL.
    """
    found: list[str] = []
    _, sep, rest = url.partition("://")
    if sep:
        userinfo, at, tail = rest.rpartition("@")
        if at and ":" in userinfo:
            found.append(userinfo.partition(":")[2])
        rest = tail if at else rest
    _, question, query = rest.partition("?")
    if question:
        for part in query.split("&"):
            name, equals, value = part.partition("=")
            if equals and _is_secret_param(name):
                found.append(value)
    decoded = [unquote(value) for value in found]
    return tuple(dict.fromkeys(v for v in [*found, *decoded] if v))


@dataclass(frozen=True, slots=True)
class SqliteUrl:
    """What a ``sqlite://`` URL says: the database path and the mode (None: the default)."""

    path: Path
    mode: str | None = None


def parse_sqlite_url(url: str) -> SqliteUrl:
    """Parse ``sqlite://PATH[?mode=ro|rw|rwc]``.

    The path is taken literally (``sqlite:///abs/x.db``, ``sqlite://rel/x.db``,
    ``~`` expanded); a ``?`` starts the options, so a file whose name holds
    ``?`` or ``#`` must be written with ``%3F`` / ``%23``. Raises
    ``StoreConfigError`` for an empty path, a NUL byte, or an unknown option.
    """
    if not url.startswith("sqlite://"):
        raise StoreConfigError(
            f"not an SQLite store URL: {_shorten(redact_url(url))!r} "
            "(expected sqlite:///path/to.db)"
        )
    raw, question, query = url[len("sqlite://") :].partition("?")
    if "#" in raw:
        raise StoreConfigError(
            f"SQLite store URL {_shorten(redact_url(url))!r}: '#' starts a fragment, which "
            "means nothing here (write %23 for a '#' in a file name)"
        )
    raw = raw.replace("%3F", "?").replace("%3f", "?").replace("%23", "#")
    if not raw:
        raise StoreConfigError(f"SQLite store URL {_shorten(redact_url(url))!r} names no file")
    if "\x00" in raw:
        raise StoreConfigError("SQLite store URL: a file name cannot contain a NUL byte")
    mode = _sqlite_mode(query, url) if question else None
    try:
        path = Path(raw).expanduser().absolute()
    except (RuntimeError, OSError) as exc:  # ~nosuchuser, or no working directory
        raise StoreConfigError(f"SQLite store path {_shorten(raw)!r}: {exc}") from None
    return SqliteUrl(path, mode)


def _sqlite_mode(query: str, url: str) -> str | None:
    try:
        options = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise StoreConfigError(
            f"SQLite store URL {_shorten(redact_url(url))!r}: malformed options after '?'"
        ) from None
    mode: str | None = None
    for name, value in options:
        if name != "mode":
            raise StoreConfigError(
                f"SQLite store URL: unknown option {_shorten(name)!r} (known: mode)"
            )
        if value not in SQLITE_MODES:
            raise StoreConfigError(
                f"SQLite store URL: mode={_shorten(value)!r} must be one of "
                + ", ".join(SQLITE_MODES)
            )
        mode = value
    return mode


def _is_secret_param(name: str) -> bool:
    lowered = unquote(name).lower()
    return any(word in lowered for word in _SECRET_PARAMS)


def _redact_query(text: str) -> str:
    head, question, query = text.partition("?")
    if not question:
        return text
    parts = []
    for part in query.split("&"):
        name, equals, _value = part.partition("=")
        parts.append(f"{name}={_MASK}" if equals and _is_secret_param(name) else part)
    return f"{head}?{'&'.join(parts)}"


def _shorten(text: str, limit: int = 200) -> str:
    """Quote at most ``limit`` characters of user input in a message."""
    return text if len(text) <= limit else text[:limit] + "..."
