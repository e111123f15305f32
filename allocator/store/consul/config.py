"""Where the Consul backend connects, from its URL and Consul's standard variables.

Pure: reads a URL and an environment mapping, touches only the files the
variables name (to check they exist, and to read a token file), and never
imports py-consul, so it is cheap to test and to import.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from allocator.errors import StoreConfigError
from allocator.store.urls import is_valid_host, redact_url

__all__ = ["DEFAULT_PORT", "DEFAULT_TLS_PORT", "ConsulConfig", "parse_consul_url"]

DEFAULT_PORT = 8500
#: Consul has no fixed HTTPS port; 8501 is the one its docs and packages use.
DEFAULT_TLS_PORT = 8501
# Go's strconv.ParseBool, which Consul's own tools use for these variables.
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


@dataclass(frozen=True, slots=True)
class ConsulConfig:
    """Where and how to reach Consul. The token is only ever sent as a header."""

    scheme: str
    host: str
    port: int
    token: str | None = field(default=None, repr=False)
    verify: bool | str = True
    cert: tuple[str, str] | None = None

    @property
    def address(self) -> str:
        """``scheme://host:port``, for messages (never holds the token)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def parse_consul_url(url: str, env: Mapping[str, str]) -> ConsulConfig:
    """Read a ``consul://`` / ``consuls://`` URL plus Consul's standard variables.

    TLS files on a plaintext connection are refused rather than ignored.
    A URL without a host uses ``CONSUL_HTTP_ADDR`` (``host:port`` or
    ``http(s)://host:port``), else ``127.0.0.1``. TLS: ``consuls://``,
    ``CONSUL_HTTP_SSL=true`` or an ``https://`` address; ``CONSUL_CACERT`` /
    ``CONSUL_CAPATH``, ``CONSUL_CLIENT_CERT`` + ``CONSUL_CLIENT_KEY``,
    ``CONSUL_HTTP_SSL_VERIFY``. Token: ``CONSUL_HTTP_TOKEN`` or
    ``CONSUL_HTTP_TOKEN_FILE``; a URL must not carry one. Raises
    ``StoreConfigError`` for anything malformed or missing.
    """
    scheme, _, rest = url.partition("://")
    if scheme not in ("consul", "consuls"):
        raise StoreConfigError(
            f"not a Consul URL: {redact_url(url)[:200]!r} (use consul:// or consuls://)"
        )
    if "@" in rest:  # never echo what came before the "@": it may be a secret
        after = redact_url(f"{scheme}://{rest.rpartition('@')[2]}")[len(scheme) + 3 :]
        raise StoreConfigError(
            f"{scheme}://...@{after[:200]}: a Consul URL must not "
            "carry credentials; set CONSUL_HTTP_TOKEN"
        )
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # unbalanced [ ] around an IPv6 host
        raise StoreConfigError(f"malformed Consul URL {redact_url(url)[:200]!r}: {exc}") from None
    shown = f"{parts.scheme}://{parts.netloc[:200]}"  # the query is left out: it may hold a token
    if parts.query or parts.fragment or parts.path not in ("", "/"):
        raise StoreConfigError(
            f"{shown}: a Consul URL is {parts.scheme}://host:port with nothing after it"
        )
    tls = parts.scheme == "consuls" or _env_bool(env, "CONSUL_HTTP_SSL")
    if parts.netloc:
        host, port = _host_port(parts.netloc, shown)
    elif env.get("CONSUL_HTTP_ADDR"):
        host, port, addr_tls = _parse_addr(env["CONSUL_HTTP_ADDR"])
        tls = tls or addr_tls
    else:
        host, port = "127.0.0.1", None
    default_port = DEFAULT_TLS_PORT if parts.scheme == "consuls" else DEFAULT_PORT
    cert = _client_cert(env)
    verify = _verify(env)
    if not tls and (cert is not None or isinstance(verify, str)):
        raise StoreConfigError(
            f"{shown}: TLS files are set (CONSUL_CACERT/CAPATH or CONSUL_CLIENT_CERT/KEY) "
            "but the connection would be plaintext: use consuls:// (or CONSUL_HTTP_SSL=true) "
            "so they are used; the token is never sent in the clear instead"
        )
    return ConsulConfig(
        scheme="https" if tls else "http",
        host=host,
        port=port or default_port,
        token=_token(env),
        verify=verify,
        cert=cert,
    )


def _host_port(netloc: str, shown: str) -> tuple[str, int | None]:
    try:
        parts = urlsplit(f"//{netloc}")
        port = parts.port
    except ValueError as exc:
        raise StoreConfigError(f"{shown}: the port must be a number from 1 to 65535") from exc
    if not parts.hostname or port == 0 or not is_valid_host(parts.hostname):
        raise StoreConfigError(f"{shown}: expected host:port")
    return parts.hostname, port


def _parse_addr(addr: str) -> tuple[str, int | None, bool]:
    scheme, _, rest = addr.rpartition("://")
    shown = f"CONSUL_HTTP_ADDR={redact_url(addr)[:200]}"
    if scheme not in ("", "http", "https"):
        raise StoreConfigError(f"{shown}: only http:// and https:// are supported")
    if "/" in rest or "@" in rest:
        raise StoreConfigError(f"{shown}: expected host:port")
    host, port = _host_port(rest, shown)
    return host, port, scheme == "https"


def _env_bool(env: Mapping[str, str], name: str) -> bool:
    value = env.get(name, "")
    if value in _TRUE or value in _FALSE or not value:
        return value in _TRUE
    raise StoreConfigError(f"{name}={value!r} is not a boolean (use true or false)")


def _existing(env: Mapping[str, str], name: str, want_dir: bool = False) -> str | None:
    path = env.get(name)
    if not path:
        return None
    if not (Path(path).is_dir() if want_dir else Path(path).is_file()):
        kind = "directory" if want_dir else "file"
        raise StoreConfigError(f"{name} names {path}, which is not an existing {kind}")
    return path


def _verify(env: Mapping[str, str]) -> bool | str:
    ca = _existing(env, "CONSUL_CACERT") or _existing(env, "CONSUL_CAPATH", want_dir=True)
    if "CONSUL_HTTP_SSL_VERIFY" in env and not _env_bool(env, "CONSUL_HTTP_SSL_VERIFY"):
        return False
    return ca or True


def _client_cert(env: Mapping[str, str]) -> tuple[str, str] | None:
    cert, key = _existing(env, "CONSUL_CLIENT_CERT"), _existing(env, "CONSUL_CLIENT_KEY")
    if (cert is None) != (key is None):
        raise StoreConfigError("set both CONSUL_CLIENT_CERT and CONSUL_CLIENT_KEY, or neither")
    return (cert, key) if cert and key else None


def _token(env: Mapping[str, str]) -> str | None:
    token = env.get("CONSUL_HTTP_TOKEN") or None
    source = "CONSUL_HTTP_TOKEN"
    if token is None and env.get("CONSUL_HTTP_TOKEN_FILE"):
        source = "CONSUL_HTTP_TOKEN_FILE"
        path = _existing(env, source)
        try:
            token = Path(path).read_text(encoding="utf-8").strip() if path else None
        except (OSError, UnicodeDecodeError) as exc:
            raise StoreConfigError(f"cannot read {source}={path}: {exc}") from exc
    if token is not None and not re.fullmatch(r"[\x21-\x7e]+", token):
        raise StoreConfigError(f"the token in {source} has characters a header cannot carry")
    return token
