"""One connection of the etcd JSON gateway client: connect, log in, post, read etcd's errors.

Used by :mod:`allocator.store.etcd.calls` (calls, failover, the call budget)
and :mod:`allocator.store.etcd.watch` (a watch's own connection).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from allocator.errors import StoreConfigError
from allocator.store.etcd.config import EtcdConfig, format_endpoint, read_pem
from allocator.store.etcd.http_wire import HttpConnection, NoAnswer, NotHttp, NotSent
from allocator.store.etcd.json_api import Json, etcd_object
from allocator.store.etcd.rules import Code, EtcdStatus

if TYPE_CHECKING:
    import ssl

__all__ = ["Endpoint", "status_of_answer", "tls_context"]

_T = TypeVar("_T")


def tls_context(config: EtcdConfig) -> ssl.SSLContext | None:
    """The TLS settings for ``config`` (``None`` for plaintext); bad files fail now."""
    if not config.tls:
        return None
    import ssl

    cadata = read_pem(config.cacert, "CA certificate")
    read_pem(config.cert, "client certificate")
    read_pem(config.key, "client key")
    try:
        context = ssl.create_default_context(cadata=cadata.decode("ascii") if cadata else None)
        if config.cert is not None and config.key is not None:
            context.load_cert_chain(config.cert, config.key)
    except (ssl.SSLError, ValueError, UnicodeDecodeError) as exc:
        raise StoreConfigError(f"etcd TLS files are not usable: {exc}") from None
    return context


def status_of_answer(status: int, body: bytes, path: str) -> EtcdStatus | NotHttp:
    """The etcd status an HTTP error answer carries (JSON ``code`` and ``message``).

    An answer that is not etcd's JSON error (a proxy's 502 page, a web
    server's 404, etcd with its gateway off) is :class:`NotHttp`: something
    else answers there, and a read moves on to the next endpoint.
    """
    try:
        data = json.loads(body)
        code = int(data["code"])
        message = str(data.get("message") or data.get("error") or f"HTTP {status}")
    except (ValueError, AttributeError, TypeError, KeyError):
        text = body[:80].decode("utf-8", "replace").strip()
        return NotHttp(f"HTTP {status} for {path} ({text!r}; is its JSON gateway on?)")
    return EtcdStatus(code, message)


class Endpoint:
    """One keep-alive connection to one endpoint, and the token it logged in with."""

    def __init__(self, config: EtcdConfig, index: int, tls: ssl.SSLContext | None) -> None:
        host, port = config.endpoints[index]
        self.name = format_endpoint(host, port)
        self.config = config
        self.host, self.port, self.tls = host, port, tls
        self.http = HttpConnection(host, port, tls)
        self.token: str | None = None
        #: An answer of this endpoint carried etcd's cluster id: etcd listens there.
        self.is_etcd = False

    def headers(self) -> dict[str, str]:
        """What every request carries: the token, when logged in."""
        return {"Authorization": self.token} if self.token else {}

    def ready(self, until: float, *, check_etcd: bool = False) -> None:
        """Connect (again, if the server closed an idle connection) and log in if needed.

        ``check_etcd``: before a write, make sure etcd is what answers here
        (one status call, unless an answer already showed it): a write that
        got something else's answer could not be told apart from one etcd
        took, so a write goes only where etcd has answered. Nothing of the
        caller's request has been sent when this fails.
        """
        if not self.http.connected or self.http.dropped():
            self.http.connect(until - time.monotonic())
        if self.token is None and self.config.username is not None:
            self.login(until)
        if check_etcd and not self.is_etcd:
            try:
                self.post("/v3/maintenance/status", {}, until)
            except NoAnswer as exc:  # the caller's request is still unsent
                raise NotSent(str(exc), exc.cause) from exc

    def login(self, until: float) -> None:
        """Get a fresh token for the configured user."""
        self.token = None  # etcd refuses even a login that carries a stale token
        body = {"name": self.config.username, "password": self.config.password}
        try:
            self.token = str(self.post("/v3/auth/authenticate", body, until)["token"])
        except NoAnswer as exc:  # the caller's request is still unsent
            raise NotSent(str(exc), exc.cause) from exc
        except KeyError:
            raise EtcdStatus(Code.UNKNOWN, "etcd's login answer holds no token") from None

    def post(self, path: str, body: Json, until: float) -> Json:
        """Send one request on the open connection; its decoded JSON answer (etcd's)."""
        return self.post_as(path, body, until, etcd_object)

    def post_as(self, path: str, body: Json, until: float, decode: Callable[[bytes], _T]) -> _T:
        """Send one request on the open connection; its answer as ``decode`` reads it.

        ``decode`` raises ``ValueError`` for an answer that is not what it
        reads, or not etcd's (every etcd answer names its cluster): that is
        :class:`NotHttp`, as is an error answer that is not etcd's.
        """
        payload = json.dumps(body, separators=(",", ":")).encode("utf-8")
        answer = self.http.request(path, payload, self.headers(), until - time.monotonic())
        if answer.status != 200:
            raise status_of_answer(answer.status, answer.body, path)
        try:
            decoded = decode(answer.body)
        except ValueError as exc:
            raise NotHttp(f"{path} answered {answer.body[:80]!r}: {exc}") from None
        self.is_etcd = True
        return decoded

    def close(self) -> None:
        """Close the connection."""
        self.http.close()
