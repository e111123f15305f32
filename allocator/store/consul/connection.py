"""One connection to a Consul agent: py-consul's client, its timeouts, its errors translated.

The only module that imports ``consul`` (py-consul, whose HTTP layer is
requests). Used by :mod:`allocator.store.consul.store` (reads, leases,
watches) and :mod:`allocator.store.consul.writes` (the writes); every call
goes inside :meth:`Client.call`, which turns requests' and py-consul's
errors into allocator's, naming the agent's address.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import consul
import consul.std
import requests
import urllib3

from allocator.errors import (
    AmbiguousWrite,
    LeaseLost,
    PermissionDenied,
    StoreConfigError,
    StoreUnavailable,
    ValueTooLarge,
)
from allocator.store.consul.config import ConsulConfig
from allocator.store.consul.payloads import consul_key, session_id

__all__ = ["Client", "translated"]


def _reason(exc: BaseException) -> str:
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return "connection timed out"
    if isinstance(exc, requests.exceptions.ReadTimeout):
        return "no answer in time"
    found = re.search(r"\[Errno -?\d+\] ([^'\")]+)", str(exc))
    return found.group(1) if found else str(exc)[:200]


def _may_have_been_sent(exc: requests.exceptions.RequestException) -> bool:
    """Whether a request that failed with ``exc`` may have reached Consul."""
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return False
    if isinstance(exc, requests.exceptions.Timeout):
        return True  # sent, but the answer did not come in time
    if isinstance(exc, requests.exceptions.ConnectionError):
        reason = getattr(exc.args[0] if exc.args else None, "reason", None)
        return not isinstance(reason, urllib3.exceptions.NewConnectionError)
    return False


@contextmanager
def translated(address: str, what: str, *, write: bool = False) -> Iterator[None]:
    """Turn requests' and py-consul's errors into allocator's, naming the address.

    A ``write`` whose request may have reached Consul before the connection
    failed raises ``AmbiguousWrite``: it may have been applied.
    """
    try:
        yield
    except requests.exceptions.SSLError as exc:
        raise StoreConfigError(f"TLS with Consul at {address} failed: {_reason(exc)}") from exc
    except (requests.exceptions.InvalidURL, requests.exceptions.InvalidHeader) as exc:
        raise StoreConfigError(f"cannot send a request to Consul at {address}: {exc}") from exc
    except requests.exceptions.RequestException as exc:
        if write and _may_have_been_sent(exc):
            raise AmbiguousWrite(
                f"Consul at {address} did not confirm the write ({what}): {_reason(exc)}; "
                "it may have been applied; re-run to check"
            ) from exc
        raise StoreUnavailable(
            f"Consul at {address} is unreachable ({what}): {_reason(exc)}"
        ) from exc
    except consul.ACLPermissionDenied as exc:
        raise PermissionDenied(f"Consul at {address} refused to {what}: {exc}") from exc
    except consul.ConsulException as exc:
        text = str(exc)
        if text.startswith("413"):
            raise ValueTooLarge(f"Consul at {address} refused to {what}: {text}") from exc
        if text[:1] == "5" or text.startswith("429"):  # server trouble or rate limiting
            raise StoreUnavailable(f"Consul at {address} failed to {what}: {text}") from exc
        # Consul answers what allocator sends with 200, 403, 404, 409 or 413: anything
        # else comes from something that is not a Consul agent (or one behind a proxy).
        raise StoreUnavailable(
            f"Consul at {address} could not {what}: {text[:200]} (is it a Consul agent?)"
        ) from exc


def _txn_reply(response: Any) -> tuple[int, Any]:
    """py-consul callback keeping a 409's body (its own raises without the errors)."""
    if response.code in (200, 409):
        return response.code, json.loads(response.body)
    if response.code == 403:
        raise consul.ACLPermissionDenied(response.body)
    raise consul.ConsulException(f"{response.code} {response.body}")


class _HTTPClient(consul.std.HTTPClient):  # type: ignore[misc]
    """py-consul's requests client with a short connect timeout.

    A blocking query's read timeout grows by its ``wait`` plus the wait/16
    jitter Consul may add, so a silent server raises instead of hanging.
    """

    def __init__(self, *args: Any, timeouts: tuple[float, float], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timeouts = timeouts

    def timeout(self, params: Any) -> tuple[float, float]:
        """(connect, read) timeouts for a request with these query ``params``."""
        connect, read = self._timeouts
        wait = dict(params or ()).get("wait")
        if wait:
            seconds = consul.std.parse_duration(str(wait))
            read += seconds + seconds / 16
        return connect, read


class Client(consul.Consul):  # type: ignore[misc]
    """py-consul's client for one Consul agent, its calls' errors translated by :meth:`call`."""

    def __init__(self, config: ConsulConfig, timeouts: tuple[float, float]) -> None:
        self.address = config.address
        self._timeouts = timeouts
        super().__init__(
            host=f"[{config.host}]" if ":" in config.host else config.host,  # IPv6 literal
            port=config.port,
            scheme=config.scheme,
            verify=config.verify,
            cert=config.cert,
        )
        self.token = config.token  # py-consul would let the environment override it

    def http_connect(
        self, host: str, port: int, scheme: str, verify: bool | str = True, cert: Any = None
    ) -> _HTTPClient:
        """py-consul's hook for its HTTP client: ours carries the connect/read timeouts."""
        return _HTTPClient(host, port, scheme, verify, cert, timeouts=self._timeouts)

    def call(self, what: str, *, write: bool = False) -> AbstractContextManager[None]:
        """A block whose errors become allocator's, naming this agent (:func:`translated`)."""
        return translated(self.address, what, write=write)

    def post_txn(self, body: str) -> tuple[int, Any]:
        """POST ``body`` to ``/v1/txn``: (200 or 409, the answer), a 409's errors kept.

        py-consul's ``txn.put`` sends no ACL token, so this goes through its HTTP client.
        """
        code, answer = self.http.put(
            _txn_reply, "/v1/txn", data=body, headers=self.prepare_headers()
        )
        return int(code), answer

    def put_value(
        self, key: str, value: bytes, *, cas: int | None, flags: int, lease: int | None
    ) -> bool:
        """``PUT /v1/kv`` (``?cas=``, ``?acquire=`` the lease's session); whether it was written.

        ``LeaseLost`` when the lease's session is gone.
        """
        session = session_id(lease) if lease is not None else None
        try:
            return bool(self.kv.put(consul_key(key), value, cas=cas, flags=flags, acquire=session))
        except consul.ConsulException as exc:
            if "session" in str(exc):
                raise LeaseLost(f"cannot write {key}: lease {lease} is gone") from exc
            raise

    def renew(self, sid: str, lease: int) -> None:
        """Renew session ``sid`` (of ``lease``); ``LeaseLost`` if Consul no longer has it."""
        try:
            self.session.renew(sid)
        except consul.NotFound as exc:
            raise LeaseLost(f"lease {lease} expired or was revoked") from exc

    def close(self) -> None:
        """Close the HTTP session (py-consul's own close() leaves it open)."""
        self.http.session.close()
