"""The etcd client's calls: the endpoint in use, the call's budget, failing over.

Every call of :class:`~allocator.store.etcd.store.EtcdStore` runs here: one
budget, ``timeout`` seconds, for connecting, TLS, logging in, failing over
and the request, each endpoint getting an equal share of what is left
(:func:`~allocator.store.etcd.rules.attempt_timeout`). A read moves on to the
next endpoint when this one could not take it; a write only when it cannot
have been applied, and one sent but not confirmed raises
:class:`~allocator.errors.AmbiguousWrite` (:func:`failure_error`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from allocator.errors import AllocatorError, AmbiguousWrite, StoreError, StoreUnavailable
from allocator.store.etcd.connection import Endpoint
from allocator.store.etcd.http_wire import HttpError, NotHttp, NotSent
from allocator.store.etcd.json_api import Json
from allocator.store.etcd.rules import (
    Code,
    EtcdStatus,
    ambiguous_write,
    attempt_timeout,
    electing,
    maybe_applied,
    token_is_stale,
    translate_status,
    worth_another_endpoint,
)

if TYPE_CHECKING:
    import ssl

    from allocator.store.etcd.config import EtcdConfig

__all__ = ["EndpointCalls", "Send", "failure_error"]

#: How long a call waits before asking every member again while they elect a leader.
ELECTION_PAUSE_S = 0.1


class _Electing(Exception):
    """Every member answered that it has no leader: ask again after a pause."""


_T = TypeVar("_T")
#: One attempt of a call on an endpoint that is connected and logged in, by a deadline.
Send = Callable[[Endpoint, float], _T]


class EndpointCalls:
    """One client's connection to etcd, moved along its endpoints as calls fail.

    ``lock`` guards the connection and ``closed``; the store holding this
    also guards its watches with it, so that closing is one step.
    """

    def __init__(self, config: EtcdConfig, tls: ssl.SSLContext | None) -> None:
        self.config = config
        self.tls = tls
        self.endpoints = config.endpoint_names
        self.lock = threading.RLock()
        self.closed = False
        self._index = 0
        self._endpoint: Endpoint | None = None

    def call(self, path: str, body: Json, *, idempotent: bool = False) -> Json:
        """Post ``body`` to ``path``: etcd's answer, with failover and the call's budget."""

        def send(endpoint: Endpoint, until: float) -> Json:
            return endpoint.post(path, body, until)

        return self.run(send, idempotent)

    def run(self, send: Send[_T], idempotent: bool) -> _T:
        """Run ``send(endpoint, until)`` within the call's budget, failing over as allowed.

        Everything before ``send`` (connecting, logging in) sends nothing of
        the call; what ``send`` raises after it wrote its request means the
        request may have arrived.
        """
        with self.lock:
            if self.closed:
                raise StoreError(f"the etcd store for {self.endpoints} is closed")
            started = time.monotonic()
            while True:
                try:
                    return self._every_endpoint(send, idempotent, started)
                except _Electing:
                    # Every member said it has no leader (one was killed, say): an
                    # election takes about a second; try them all again within the budget.
                    self._next_endpoint()
                    time.sleep(ELECTION_PAUSE_S)

    def _every_endpoint(self, send: Send[_T], idempotent: bool, started: float) -> _T:
        """One pass over the endpoints; ``_Electing`` when the last said there is no leader."""
        count = len(self.config.endpoints)
        # A member said there is no leader: one refusing connections after it (the
        # killed leader, tried last) still means the others are electing one.
        electing_seen = False
        for tried in range(1, count + 1):
            share = attempt_timeout(
                started + self.config.timeout - time.monotonic(), count - tried + 1
            )
            until = time.monotonic() + share
            endpoint = self._current()
            where = endpoint.name if tried == 1 else self.endpoints
            sent = False
            try:
                endpoint.ready(until, check_etcd=not idempotent)
                sent = True
                return self._with_fresh_token(endpoint, send, until)
            except (HttpError, EtcdStatus) as exc:
                last, timeout = tried == count, self.config.timeout
                if isinstance(exc, EtcdStatus) and electing(exc.code, exc.details):
                    electing_seen = True
                error = failure_error(exc, where, sent, idempotent, last=last, timeout=timeout)
                if error is None:
                    self._next_endpoint()
                    continue
                left = started + timeout - time.monotonic()
                if (
                    last
                    and electing_seen
                    and not isinstance(error, AmbiguousWrite)
                    and left > 2 * ELECTION_PAUSE_S
                ):
                    raise _Electing from exc
                raise error from exc
        raise AssertionError("every attempt returns or raises")

    def spare_connection(self) -> Endpoint:
        """A second connection to the endpoint in use, carrying its login token (not yet open)."""
        with self.lock:
            endpoint = Endpoint(self.config, self._index, self.tls)
            if self._endpoint is not None:
                endpoint.token = self._endpoint.token
        return endpoint

    def close_connection(self) -> None:
        """Close the connection in use (``closed`` already set: no call opens another)."""
        with self.lock:
            endpoint, self._endpoint = self._endpoint, None
        if endpoint is not None:
            endpoint.close()

    def _with_fresh_token(self, endpoint: Endpoint, send: Send[_T], until: float) -> _T:
        try:
            return send(endpoint, until)
        except EtcdStatus as exc:
            # Log in again, once, as etcd's own client does.
            if not token_is_stale(exc.details) or self.config.username is None:
                raise
        endpoint.login(until)
        return send(endpoint, until)

    def _current(self) -> Endpoint:
        if self._endpoint is None:
            self._endpoint = Endpoint(self.config, self._index, self.tls)
        return self._endpoint

    def _next_endpoint(self) -> None:
        if self._endpoint is not None:
            self._endpoint.close()
            self._endpoint = None
        self._index = (self._index + 1) % len(self.config.endpoints)


def failure_error(
    exc: Exception, where: str, sent: bool, idempotent: bool, *, last: bool, timeout: float
) -> AllocatorError | None:
    """The error to raise for a failed attempt, or ``None`` to try the next endpoint."""
    if isinstance(exc, NotHttp):  # not etcd's answer: another endpoint may be etcd
        if sent and not idempotent:  # etcd answered here before: it may have taken it
            return ambiguous_write(where, timeout)
        if last:
            return StoreUnavailable(f"etcd at {where}: {exc} (is it an etcd v3 server?)")
        return None
    if isinstance(exc, EtcdStatus):
        code, details = exc.code, exc.details
    elif isinstance(exc, NotSent) or not sent:
        code, details = Code.UNAVAILABLE, f"failed to connect: {exc}"
    else:  # the request went out; nothing (complete) came back
        code, details = Code.DEADLINE_EXCEEDED, str(exc)
    if sent and not idempotent and maybe_applied(code, details):
        return ambiguous_write(where, timeout)
    if last or not worth_another_endpoint(code, details, idempotent or not sent):
        if code == Code.DEADLINE_EXCEEDED:
            return StoreUnavailable(f"etcd at {where} gave no answer ({details})")
        return translate_status(code, details, where)
    return None
