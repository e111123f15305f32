"""Where and how to reach etcd: the URL plus etcdctl's environment variables.

Pure parsing, no I/O except reading TLS files on request, and no client
library: the CLI can validate a store URL without opening a connection.

``etcd://[user[:password]@]h1:2379,h2:2379[/][?cacert=F&cert=F&key=F&timeout=S]``;
``etcds://`` means TLS. Where the URL says nothing, etcdctl's variables
apply: ``ETCDCTL_ENDPOINTS`` (``http://`` or ``https://`` endpoints),
``ETCDCTL_USER`` (``user:password``, or ``user`` plus ``ETCDCTL_PASSWORD``),
``ETCDCTL_CACERT``, ``ETCDCTL_CERT``, ``ETCDCTL_KEY``. No endpoint at all
means ``127.0.0.1:2379``, as for etcdctl.

TLS files on a plaintext URL are refused rather than ignored: etcdctl and
etcd's Go client quietly dial ``http://`` endpoints in the clear even when
given a CA, which sends the password unencrypted to whoever answers.
``timeout`` is the whole budget of one store call (connecting, logging in
and the request itself), from 0.05 to 300 seconds.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from allocator.errors import StoreConfigError
from allocator.store.urls import is_valid_host, redact_url

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_TIMEOUT",
    "MAX_TIMEOUT",
    "MIN_TIMEOUT",
    "EtcdConfig",
    "format_endpoint",
    "parse_etcd_url",
    "read_pem",
    "redact_url",
]

DEFAULT_PORT = 2379
#: Seconds one request may take before the store counts as unavailable.
DEFAULT_TIMEOUT = 5.0
MIN_TIMEOUT = 0.05
MAX_TIMEOUT = 300.0
_QUERY_KEYS = frozenset({"cacert", "cert", "key", "timeout"})


@dataclass(frozen=True)
class EtcdConfig:
    """Everything needed to connect, resolved from the URL and ``ETCDCTL_*``."""

    endpoints: tuple[tuple[str, int], ...]
    tls: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    cacert: str | None = None
    cert: str | None = None
    key: str | None = None
    timeout: float = DEFAULT_TIMEOUT

    @property
    def endpoint_names(self) -> str:
        """``h1:2379,h2:2379``, for messages."""
        return ",".join(format_endpoint(host, port) for host, port in self.endpoints)


def format_endpoint(host: str, port: int) -> str:
    """``host:port``, with IPv6 hosts in brackets (as etcdctl writes them)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_etcd_url(url: str, env: Mapping[str, str] | None = None) -> EtcdConfig:
    """Resolve ``url`` plus ``ETCDCTL_*`` variables from ``env`` (default: the process's).

    The URL wins wherever it says something. Raises ``StoreConfigError`` for
    anything malformed; never reads a file.
    """
    env = os.environ if env is None else env
    scheme, sep, _ = url.partition("://")
    if not sep or scheme not in ("etcd", "etcds"):
        raise StoreConfigError(f"not an etcd URL: {redact_url(url)!r} (want etcd:// or etcds://)")
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # unbalanced [ ] around an IPv6 host
        raise StoreConfigError(f"malformed etcd URL {redact_url(url)!r}: {exc}") from None
    if parts.path not in ("", "/") or parts.fragment:
        raise StoreConfigError(f"etcd URL {redact_url(url)!r} must not have a path or fragment")
    userinfo, at, hosts = parts.netloc.rpartition("@")
    endpoints, tls = _endpoints(hosts, scheme == "etcds", url, env)
    options = _query_options(parts.query, url)
    user, password = _credentials(userinfo if at else None, env)
    cacert = options.get("cacert", env.get("ETCDCTL_CACERT")) or None
    cert = options.get("cert", env.get("ETCDCTL_CERT")) or None
    key = options.get("key", env.get("ETCDCTL_KEY")) or None
    if (cert is None) != (key is None):
        raise StoreConfigError("etcd client TLS needs both a certificate and its key")
    if not tls and (cacert or cert or key):
        raise StoreConfigError(
            f"etcd URL {redact_url(url)!r} is plaintext but TLS files are given "
            "(cacert/cert/key, or ETCDCTL_CACERT/CERT/KEY): use etcds:// (or https:// "
            "endpoints) so they are used; credentials are never sent in the clear instead"
        )
    return EtcdConfig(
        endpoints=endpoints,
        tls=tls,
        username=user,
        password=password,
        cacert=cacert,
        cert=cert,
        key=key,
        timeout=float(options.get("timeout", DEFAULT_TIMEOUT)),
    )


def read_pem(path: str | None, what: str) -> bytes | None:
    """Read a PEM file; ``StoreConfigError`` naming the file if missing or not PEM."""
    if path is None:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise StoreConfigError(f"cannot read etcd {what} file {path}: {exc.strerror}") from exc
    if b"-----BEGIN" not in data:
        raise StoreConfigError(f"etcd {what} file {path} is not a PEM file")
    return data


def _endpoints(
    hosts: str, tls: bool, url: str, env: Mapping[str, str]
) -> tuple[tuple[tuple[str, int], ...], bool]:
    if hosts:
        # Never echo an endpoint of a URL: a password holding a raw "/" or "?" makes
        # part of it look like a host; the redacted URL is safe to show instead.
        source = f"etcd URL {redact_url(url)!r}"
        return tuple(_parse_endpoint(h, source, echo=False) for h in hosts.split(",")), tls
    if not env.get("ETCDCTL_ENDPOINTS"):
        return ((("127.0.0.1", DEFAULT_PORT),), tls)
    endpoints, schemes = [], set()
    for item in env["ETCDCTL_ENDPOINTS"].split(","):
        item_scheme, sep, address = item.strip().partition("://")
        schemes.add(item_scheme if sep else "http")
        endpoints.append(
            _parse_endpoint((address if sep else item).rstrip("/"), "ETCDCTL_ENDPOINTS")
        )
    if len(schemes) > 1 or not schemes <= {"http", "https"}:
        raise StoreConfigError("ETCDCTL_ENDPOINTS must all use http:// or all use https://")
    return tuple(endpoints), tls or schemes == {"https"}


def _parse_endpoint(text: str, source: str, *, echo: bool = True) -> tuple[str, int]:
    text = text.strip()
    shown = f"endpoint {text!r}" if echo else "an endpoint"
    if text.startswith("["):  # [v6] or [v6]:port
        host, closed, rest = text[1:].partition("]")
        if not closed or (rest and not rest.startswith(":")):
            raise StoreConfigError(f"{source}: malformed {shown}")
        has_port, port_text = bool(rest), rest[1:]
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
        has_port = True
    elif ":" in text:
        raise StoreConfigError(f"{source}: write IPv6 endpoints as [addr]:port ({shown})")
    else:
        host, has_port, port_text = text, False, ""
    if not is_valid_host(host):
        raise StoreConfigError(f"{source}: {shown} has an empty or malformed host")
    if not has_port:
        return host, DEFAULT_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise StoreConfigError(f"{source}: {shown} has a bad port (1-65535)")
    return host, int(port_text)


def _credentials(userinfo: str | None, env: Mapping[str, str]) -> tuple[str | None, str | None]:
    user: str | None = None
    password: str | None = None
    if userinfo is not None:
        name, colon, secret = userinfo.partition(":")
        user, password = unquote(name), (unquote(secret) if colon else None)
    elif env.get("ETCDCTL_USER"):
        user, colon, secret = env["ETCDCTL_USER"].partition(":")
        password = secret if colon else None
    if user is None:
        return None, None
    if not user:
        raise StoreConfigError("etcd user name is empty")
    if password is None:
        password = env.get("ETCDCTL_PASSWORD")
        if password is None:
            raise StoreConfigError(
                "the etcd user has no password: give user:password or set ETCDCTL_PASSWORD"
            )
    return user, password


def _query_options(query: str, url: str) -> dict[str, str]:
    try:
        options = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)))
    except ValueError:
        raise StoreConfigError(f"malformed options in etcd URL {redact_url(url)!r}") from None
    unknown = sorted(set(options) - _QUERY_KEYS)
    if unknown:
        known = ", ".join(sorted(_QUERY_KEYS))
        names = ", ".join(repr(name[:40]) for name in unknown[:5])
        raise StoreConfigError(f"unknown etcd URL option(s) {names}; known: {known}")
    timeout = options.get("timeout")
    if timeout is not None and not _timeout_in_range(timeout):
        raise StoreConfigError(
            f"etcd URL option timeout={timeout[:40]!r} must be seconds from "
            f"{MIN_TIMEOUT:g} to {MAX_TIMEOUT:g}"
        )
    return options


def _timeout_in_range(text: str) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return MIN_TIMEOUT <= value <= MAX_TIMEOUT
