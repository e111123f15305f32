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

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, unquote

from allocator.errors import StoreConfigError

__all__ = [
    "MAX_URL_LENGTH",
    "SCHEMES",
    "SECRET_WORDS",
    "SQLITE_MODES",
    "SqliteUrl",
    "is_valid_host",
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
SECRET_WORDS = ("password", "passwd", "pwd", "token", "secret", "auth")
_SECRET_PARAMS = SECRET_WORDS
# name=value after "?", "&" or ";" (or at the start), the name holding a secret word.
_SECRET_PARAM = re.compile(
    r"((?:^|[?&;])[^=&;?#\s]*(?:" + "|".join(_SECRET_PARAMS) + r")[^=&;?#\s]*=)[^&;#\s]*",
    re.IGNORECASE,
)
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
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
    if not sep:  # echo nothing of it: without a scheme, any of it may be a secret
        raise StoreConfigError(f"the store URL has no scheme: expected one of {known}")
    raise StoreConfigError(
        f"unknown store URL scheme {_shorten(scheme, 40)!r}: expected one of {known}"
    )


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
    name, colon, _ = userinfo.partition(":")
    if at and colon and not any(c in name for c in "@/?#[]"):
        rest = f"{name}:{_MASK}@{tail}"
    elif at:  # no user name to keep, or one that cannot be one (it holds a host)
        rest = f"{_MASK}@{tail}"
    return f"{scheme}://{_redact_query(rest)}"


def redact_urls(text: str) -> str:
    """``text`` with every URL in it redacted (see :func:`redact_url`)."""
    if "://" not in text and "=" not in text:
        return text
    return _URL_IN_TEXT.sub(lambda found: redact_url(found.group(0)), text)


def is_valid_host(host: str) -> bool:
    """Whether ``host`` is an IP address or an RFC 1123 host name (nothing to send to DNS else).

    Checked before any connection, so a mangled URL is an input error
    instead of a name lookup of whatever text ended up where the host goes.
    """
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    name = host[:-1] if host.endswith(".") else host
    return 0 < len(name) <= 253 and all(_LABEL.fullmatch(label) for label in name.split("."))


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
    found += [m.group(0)[len(m.group(1)) :] for m in _SECRET_PARAM.finditer(url)]
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
    ``?`` or ``#`` must be written with ``%3F`` / ``%23`` (and an ``@`` in the
    first part of a relative path with ``%40``: ``user@`` there reads as
    credentials, which SQLite has none of). Raises ``StoreConfigError`` for
    an empty path, credentials, a NUL byte, or an unknown option.
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
    if "@" in raw.split("/", 1)[0]:
        raise StoreConfigError(
            f"SQLite store URL {_shorten(redact_url(url))!r}: an SQLite URL takes no user or "
            "password (write %40 for an '@' that starts a file name)"
        )
    for escaped, character in (("%3F", "?"), ("%3f", "?"), ("%23", "#"), ("%40", "@")):
        raw = raw.replace(escaped, character)
    if not raw:
        raise StoreConfigError(f"SQLite store URL {_shorten(redact_url(url))!r} names no file")
    if "\x00" in raw:
        raise StoreConfigError("SQLite store URL: a file name cannot contain a NUL byte")
    mode = _sqlite_mode(query, url) if question else None
    if raw.startswith("//"):
        # ``sqlite:////abs`` (a slash too many) names /abs, as the kernel reads it. Kept as
        # written, a path starting with two slashes becomes an authority in the read-only
        # ``file:`` URI: writes would work and every read fail.
        raw = "/" + raw.lstrip("/")
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


def _redact_query(text: str) -> str:
    """Mask the value of every ``name=value`` whose name says secret, wherever it is."""
    return _SECRET_PARAM.sub(lambda found: f"{found.group(1)}{_MASK}", text)


def _shorten(text: str, limit: int = 200) -> str:
    """Quote at most ``limit`` characters of user input in a message."""
    return text if len(text) <= limit else text[:limit] + "..."
