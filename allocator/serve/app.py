"""``allocator serve``: the ASGI application (starlette) over one fleet mirror.

Routes (all read-only):

* ``/``: the status page (one small HTML file, no build step);
* ``/static/{path}``: its scripts and the vendored uPlot (:mod:`allocator.serve.static_files`);
* ``/api/v1/status``: the same JSON as ``allocator status -o json``; with
  ``host``, ``pool``, ``job``, ``state`` filters and ``page``/``per_page``,
  one page of the hosts they select;
* ``/api/v1/hosts/{host}``: ``allocator status host=H -o json``;
* ``/api/v1/fleet``: the whole fleet as a grid, one character per GPU;
* ``/api/v1/summary``: ``allocator status --summary -o json``;
* ``/api/v1/series``: GPUs by state per pool and the queue over time;
* ``/api/v1/history``: the same JSON as ``allocator history -o json``
  (``job``, ``host``, ``gpu``, ``since``, ``limit`` query parameters);
* ``/api/v1/queue``: the same JSON as ``allocator queue -o json``;
* ``/api/v1/usage``: the same JSON as ``allocator usage -o json``
  (``since``, ``by``, ``limit``; an answer is kept 30 s);
* ``/api/v1/events``: server-sent events, one ``fleet`` event per change;
* ``/metrics``: fleet-level Prometheus series.

Viewers never cause store reads: one watcher keeps the mirror current, the
view rebuilds the hosts that changed (:mod:`allocator.serve.fleet_view`), and
on each change :class:`Broadcaster` builds the page's document once and
hands the same bytes to every open event stream. While the store is down
everything is answered from the last state, and says since when.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from importlib import resources
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from allocator.errors import AllocatorError
from allocator.serve.fleet_api import (
    StatusQuery,
    fleet_json,
    host_json,
    metrics_text,
    parse_status_query,
    status_json,
)
from allocator.serve.fleet_view import FleetView
from allocator.serve.guard import HeaderMiddleware, page_policy
from allocator.serve.history import error_answer, history_json
from allocator.serve.mirror import FleetMirror
from allocator.serve.select import select_hosts, summary_json
from allocator.serve.series import (
    COUNTED,
    DEFAULT_POINTS,
    DEFAULT_SAMPLE_SECONDS,
    Sample,
    Series,
)
from allocator.serve.static_files import static_route
from allocator.serve.usage import UsageAnswers
from allocator.serve.watcher import FleetWatcher
from allocator.status.metrics import CONTENT_TYPE
from allocator.store import Store
from allocator.util.times import format_time, utc_now

__all__ = [
    "HISTORY_THREADS",
    "KEEPALIVE_SECONDS",
    "REFRESH_SECONDS",
    "Broadcaster",
    "Fleet",
    "build_app",
]

_T = TypeVar("_T")

#: A comment line on idle event streams, so proxies do not close them.
KEEPALIVE_SECONDS = 15.0
#: The page's document is rebuilt this often even without a change (times move on).
REFRESH_SECONDS = 30.0
#: Changes arriving this close together are shown once.
_DEBOUNCE_SECONDS = 0.05
#: History requests read the store (status and metrics read the mirror): they get
#: threads of their own, so a burst of them queues behind itself, never in front
#: of a Prometheus scrape or the page's data.
HISTORY_THREADS = 4


class Fleet:
    """The mirror, its watcher, the view built from them, and the series sampled from it."""

    def __init__(
        self,
        open_store: Callable[[], Store],
        mirror: FleetMirror,
        url: str,
        wall: Callable[[], datetime] = utc_now,
        series: Series | None = None,
    ) -> None:
        self.open_store = open_store
        self.mirror = mirror
        self.url = url
        self.wall = wall
        self.bad: dict[str, None] = {}
        self.view = FleetView(mirror, self._note_bad)
        self.series = series or Series(DEFAULT_SAMPLE_SECONDS, DEFAULT_POINTS)
        self.watcher = FleetWatcher(open_store, mirror, self._changed, wall=wall)
        self.on_change: Callable[[], None] = lambda: None
        #: Ends every open event stream (the server is stopping); set while serving.
        self.end_streams: Callable[[], None] = lambda: None

    def _changed(self) -> None:
        self.on_change()

    def _note_bad(self, text: str) -> None:
        self.bad[text] = None

    def read(self, build: Callable[[FleetView], _T]) -> _T:
        """``build(view)``, the hosts changed since the last read rebuilt first.

        The view does not change while ``build`` reads it.
        """
        with self.view.lock:
            self.view.update(self.wall(), time.monotonic())
            return build(self.view)

    def status(self, query: StatusQuery | None = None) -> bytes | Iterator[bytes]:
        """``status -o json`` of the mirrored fleet (or of a page of it), now."""
        return self.read(lambda view: status_json(view, query or StatusQuery({}), select_hosts))

    def page_document(self) -> bytes:
        """What every viewer's page gets on each change: status, store state, time."""
        rest = {
            "store": {"url": self.url, **self.watcher.state.to_dict()},
            "loaded": self.mirror.loaded,
            "at": format_time(self.wall()),
        }
        status = self.status()
        status = status if isinstance(status, bytes) else b"".join(status)
        return b'{"status":' + status + b"," + json.dumps(rest)[1:].encode()

    def metrics(self) -> bytes:
        """The fleet's Prometheus exposition."""
        down = self.watcher.down_since_monotonic
        seconds = time.monotonic() - down if down is not None else 0.0
        return self.read(lambda view: metrics_text(view, self.watcher.state.up, seconds))

    def sample(self, now: float) -> Sample:
        """The fleet's counts at epoch ``now``, for the series."""

        def counts(view: FleetView) -> Sample:
            rows = view.totals.pools
            pools = {pool: _counted(row) for pool, row in rows.items() if pool is not None}
            total = {name: sum(getattr(row, name) for row in rows.values()) for name in COUNTED}
            utilisation = self.mirror.utilisation_percent()
            return Sample(now, pools, total, utilisation, self.mirror.queued)

        return self.read(counts)


class Broadcaster:
    """One document per change, shared by every event stream (the latest only, no backlog).

    Nothing is built while no stream is open: a fleet's document is megabytes.
    """

    def __init__(self, build: Callable[[], bytes]) -> None:
        self._build = build
        self.version = 0
        self.payload = b""
        self._dirty = asyncio.Event()
        self._ready = asyncio.Condition()
        self._wanted = asyncio.Event()
        self._streams = 0
        self.closed = False

    def poke(self) -> None:
        """Something changed (call on the event loop)."""
        self._dirty.set()

    def join(self) -> int:
        """A stream opens: the version it has seen (the next one is built for it)."""
        self._streams += 1
        self._wanted.set()
        self.poke()
        return self.version

    def leave(self) -> None:
        """A stream ends."""
        self._streams -= 1
        if not self._streams:
            self._wanted.clear()

    async def run(self, warm: Callable[[], None] = lambda: None) -> None:
        """Rebuild on each change (debounced) and at least every :data:`REFRESH_SECONDS`.

        With no stream open, ``warm()`` instead: what the document is made
        from is brought up to date, so the API's next answer need not.
        """
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), REFRESH_SECONDS)
            await asyncio.sleep(_DEBOUNCE_SECONDS)
            self._dirty.clear()
            if not self._wanted.is_set():
                await asyncio.to_thread(warm)
                continue
            payload = await asyncio.to_thread(self._build)
            async with self._ready:
                self.version += 1
                self.payload = payload
                self._ready.notify_all()

    async def close(self) -> None:
        """End every stream waiting in :meth:`next` (the server is stopping)."""
        async with self._ready:
            self.closed = True
            self._ready.notify_all()

    async def next(self, seen: int, timeout: float) -> tuple[int, bytes] | None:
        """The newest document after version ``seen``, or ``None`` after ``timeout`` seconds."""
        async with self._ready:
            if self.version == seen and not self.closed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._ready.wait(), timeout)
            if self.version == seen:
                return None
            return self.version, self.payload


def _page() -> str:
    return resources.files("allocator.serve").joinpath("static/index.html").read_text()


def build_app(fleet: Fleet, allowed_hosts: Sequence[str] = ("*",)) -> Starlette:
    """The application: starts the watcher with the server, stops it with the server.

    ``allowed_hosts``: the ``Host`` names it answers (``*.example.com``
    patterns; ``*`` answers any); any other gets 400.
    """
    page = _page()
    page_headers = {"Cache-Control": "no-cache", "Content-Security-Policy": page_policy(page)}
    state: dict[str, Broadcaster] = {}
    history_pool = ThreadPoolExecutor(HISTORY_THREADS, thread_name_prefix="serve-history")
    usage_answers = UsageAnswers(fleet.open_store, fleet.mirror.layout)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        broadcaster = Broadcaster(fleet.page_document)
        state["broadcaster"] = broadcaster
        loop = asyncio.get_running_loop()

        def changed() -> None:  # from the watcher's thread
            loop.call_soon_threadsafe(broadcaster.poke)

        fleet.on_change = changed

        def end_streams() -> None:  # from the signal handler
            loop.call_soon_threadsafe(lambda: loop.create_task(broadcaster.close()))

        fleet.end_streams = end_streams
        task = asyncio.create_task(broadcaster.run(warm=lambda: fleet.read(_nothing)))
        sampler = asyncio.create_task(_sample(fleet))
        fleet.watcher.start()
        broadcaster.poke()
        try:
            yield
        finally:
            task.cancel()
            sampler.cancel()
            history_pool.shutdown(wait=False, cancel_futures=True)
            await asyncio.to_thread(fleet.watcher.stop)

    async def index(_request: Request) -> Response:
        return HTMLResponse(page, headers=page_headers)

    async def answer(build: Callable[[], bytes | Iterator[bytes]]) -> Response:
        """``build()``'s JSON from the mirror (in a thread), or its error answer."""
        if not fleet.mirror.loaded:
            return _unavailable(fleet)
        try:
            body = await asyncio.to_thread(build)
        except AllocatorError as exc:
            code, document = error_answer(exc)
            return JSONResponse(document, status_code=code)
        headers = _store_header(fleet)
        if isinstance(body, bytes):
            return Response(body, media_type="application/json", headers=headers)
        return StreamingResponse(body, media_type="application/json", headers=headers)

    async def status(request: Request) -> Response:
        query = dict(request.query_params)
        return await answer(lambda: fleet.status(parse_status_query(query)))

    async def fleet_grid(_request: Request) -> Response:
        at = format_time(fleet.wall())
        return await answer(lambda: fleet.read(lambda view: fleet_json(view, at)))

    async def host(request: Request) -> Response:
        name = request.path_params["host"]
        return await answer(lambda: fleet.read(lambda view: host_json(view, name)))

    async def summary(_request: Request) -> Response:
        return await answer(lambda: fleet.read(summary_json))

    async def series(_request: Request) -> Response:
        return JSONResponse(fleet.series.document())

    async def history(request: Request) -> Response:
        read = functools.partial(
            history_json, fleet.open_store, fleet.mirror.layout, dict(request.query_params)
        )
        code, document = await asyncio.get_running_loop().run_in_executor(history_pool, read)
        return JSONResponse(document, status_code=code)

    async def queue(_request: Request) -> Response:
        from allocator.serve.queue import queue_json

        read = functools.partial(queue_json, fleet.open_store, fleet.mirror.layout)
        code, document = await asyncio.get_running_loop().run_in_executor(history_pool, read)
        return JSONResponse(document, status_code=code)

    async def usage(request: Request) -> Response:
        read = functools.partial(usage_answers.answer, dict(request.query_params))
        code, document = await asyncio.get_running_loop().run_in_executor(history_pool, read)
        return JSONResponse(document, status_code=code)

    async def events(request: Request) -> Response:
        broadcaster = state["broadcaster"]

        async def stream() -> AsyncIterator[bytes]:
            seen = broadcaster.join()
            try:
                while not broadcaster.closed and not await request.is_disconnected():
                    found = await broadcaster.next(seen, KEEPALIVE_SECONDS)
                    if broadcaster.closed:
                        return
                    if found is None:
                        yield b": keep-alive\n\n"
                        continue
                    seen, payload = found
                    yield b"event: fleet\ndata: " + payload + b"\n\n"
            finally:
                broadcaster.leave()

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)

    async def metrics(_request: Request) -> Response:
        body = await asyncio.to_thread(fleet.metrics)
        return Response(body, media_type=CONTENT_TYPE)

    routes = [
        Route("/", index),
        static_route(),
        Route("/api/v1/status", status),
        Route("/api/v1/fleet", fleet_grid),
        Route("/api/v1/hosts/{host}", host),
        Route("/api/v1/summary", summary),
        Route("/api/v1/series", series),
        Route("/api/v1/history", history),
        Route("/api/v1/queue", queue),
        Route("/api/v1/usage", usage),
        Route("/api/v1/events", events),
        Route("/metrics", metrics),
    ]
    middleware = [
        Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts), www_redirect=False),
        Middleware(
            HeaderMiddleware,
            headers={"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"},
        ),
    ]
    return Starlette(routes=routes, lifespan=lifespan, middleware=middleware)


def _nothing(_view: FleetView) -> None:
    return None


def _counted(row: Any) -> dict[str, int]:
    return {name: getattr(row, name) for name in COUNTED}


async def _sample(fleet: Fleet) -> None:
    """Add a sample to the series whenever one is due (from serve's own counts)."""
    while True:
        await asyncio.sleep(fleet.series.due_in(time.time()))
        if fleet.mirror.loaded:
            await asyncio.to_thread(fleet.series.tick, time.time(), fleet.sample)
        else:
            await asyncio.sleep(fleet.series.interval)


def _store_header(fleet: Fleet) -> dict[str, str]:
    state = fleet.watcher.state
    if state.up:
        return {}
    return {"X-Allocator-Store": f"unavailable since {state.since}; showing the last state read"}


def _unavailable(fleet: Fleet) -> Response:
    state = fleet.watcher.state
    return JSONResponse(
        {
            "error": "store unavailable",
            "exit_code": 4,
            "message": f"{fleet.url}: store unavailable since {state.since}: {state.error}",
        },
        status_code=503,
    )
