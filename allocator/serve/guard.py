"""What keeps ``allocator serve`` up under its clients: request deadlines, hosts, headers.

* A connection must send a whole request head within ``request_seconds`` of
  opening (or of its last response): silent and trickling connections are
  closed instead of holding a file descriptor forever. uvicorn times out
  only idle keep-alive connections, after a response.
* Only the ``Host`` names the server is configured for are answered, so a
  page on another site cannot read the API through a DNS-rebinding name
  (the status carries command lines of unassigned processes).
* Every response says ``X-Content-Type-Options: nosniff``, and the page a
  Content-Security-Policy allowing nothing but itself: its inline script and
  style, by hash, its own origin's scripts and styles, and requests to it.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = [
    "DEFAULT_PER_CLIENT",
    "DEFAULT_REQUEST_SECONDS",
    "HeaderMiddleware",
    "guarded_protocol",
    "page_policy",
]

#: How long a connection may take to send a request head.
DEFAULT_REQUEST_SECONDS = 10.0


#: Connections one client address may hold at once (open pages' event streams included).
DEFAULT_PER_CLIENT = 32
_REFUSAL = b"too many connections from this address\n"
_TOO_MANY = (
    b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_REFUSAL), _REFUSAL)
)


def guarded_protocol(
    request_seconds: float, per_client: int = DEFAULT_PER_CLIENT
) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol: request-head deadline, ``per_client`` connections an address."""
    held: dict[str, int] = {}  # open connections by client address (one event loop: no lock)

    class GuardedProtocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _address: str | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            peer = transport.get_extra_info("peername")
            address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
            if held.get(address, 0) >= per_client:
                transport.write(_TOO_MANY)
                transport.close()
                return
            held[address] = held.get(address, 0) + 1
            self._address = address
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            if self._address is not None:
                left = held[self._address] - 1
                if left:
                    held[self._address] = left
                else:
                    del held[self._address]
                self._address = None
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            waiting_for = self.cycle  # a new request head replaces it
            self._deadline = self.loop.call_later(request_seconds, self._expire, waiting_for)

        def _expire(self, waiting_for: Any) -> None:
            busy = self.cycle is not None and not self.cycle.response_complete
            if self.cycle is waiting_for and not busy and not self.transport.is_closing():
                self.transport.close()

    return GuardedProtocol


def page_policy(page: str) -> str:
    """The page's Content-Security-Policy: inline script and style by hash, the rest same-origin."""

    def hashes(tag: str) -> str:
        bodies = re.findall(rf"<{tag}>(.*?)</{tag}>", page, re.S)
        return " ".join(
            f"'sha256-{base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()}'"
            for b in bodies
        )

    return (
        "default-src 'none'; "
        f"script-src 'self' {hashes('script')}; style-src 'self' {hashes('style')}; "
        "connect-src 'self'; img-src 'self' data:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


class HeaderMiddleware:
    """Adds fixed headers to every HTTP response (pure ASGI: streams stay streams)."""

    def __init__(self, app: ASGIApp, headers: dict[str, str]) -> None:
        """Wrap ``app``; ``headers`` are added to each response that lacks them."""
        self.app = app
        self.headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on, adding the headers to the response's start."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name for name, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in self.headers if k not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, sending)
