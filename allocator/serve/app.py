"""``allocator serve``: the ASGI application (starlette) over one fleet mirror.

Routes (all read-only):

* ``/``: the status page (one small HTML file, no build step);
* ``/static/{path}``: its scripts and the vendored uPlot (:mod:`allocator.serve.static_files`);
* ``/api/v1/status``: the same JSON as ``allocator status -o json``; with
  ``host``, ``pool``, ``job``, ``state`` filters and ``page``/``per_page``,
  one page of the hosts they select;
* ``/api/v1/hosts/{host}``: ``allocator status host=H -o json``;
* ``/api/v1/fleet``: the whole fleet as a grid, one character per GPU;
* ``/api/v1/free``: the hosts with the most free GPUs (``pool``, ``limit``);
* ``/api/v1/broken``: unhealthy GPUs and agents down, since when (``limit``);
* ``/api/v1/summary``: ``allocator status --summary -o json``;
* ``/api/v1/series``: GPUs by state per pool and the queue over time;
* ``/api/v1/history``: the same JSON as ``allocator history -o json``
  (``job``, ``host``, ``gpu``, ``since``, ``limit`` query parameters);
* ``/api/v1/queue``: the same JSON as ``allocator queue -o json``;
* ``/api/v1/usage``: the same JSON as ``allocator usage -o json``
  (``since``, ``by``, ``limit``, ``jobs=count``; a read is kept 30 s);
* ``/api/v1/events``: server-sent events, the whole document (``snapshot=grid``: the
  fleet's grid, as the page reads it) then the hosts of each change;
* ``/metrics``: fleet-level Prometheus series.

Viewers never cause store reads: one watcher keeps the mirror current, the
view rebuilds the hosts that changed (:mod:`allocator.serve.fleet_view`), and
on each change a :class:`~allocator.serve.broadcast.Broadcaster` builds the
changed hosts' event once and hands the same bytes to every open event stream.
Every answer reads the :class:`~allocator.serve.fleet.Fleet`. While the store
is down everything is answered from the last state, and says since when.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import resources

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from allocator.errors import AllocatorError, InvalidInput
from allocator.serve.broadcast import Broadcaster, event_stream
from allocator.serve.fleet import Fleet
from allocator.serve.fleet_api import fleet_json, host_json, parse_status_query
from allocator.serve.free import broken_answer, free_answer
from allocator.serve.guard import HeaderMiddleware, page_policy
from allocator.serve.history import error_answer, history_json
from allocator.serve.select import summary_json
from allocator.serve.static_files import static_route
from allocator.serve.usage import UsageAnswers, mirrored_assignments
from allocator.status.metrics import CONTENT_TYPE
from allocator.util.times import format_time

__all__ = ["HISTORY_THREADS", "build_app"]
#: History requests read the store (status and metrics read the mirror): they get
#: threads of their own, so a burst of them queues behind itself, never in front
#: of a Prometheus scrape or the page's data.
HISTORY_THREADS = 4


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
    usage_answers = UsageAnswers(
        fleet.open_store, fleet.mirror.layout, current=lambda: mirrored_assignments(fleet.mirror)
    )

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        broadcaster = Broadcaster(fleet.page_document, fleet.page_change)
        state["broadcaster"] = broadcaster
        loop = asyncio.get_running_loop()

        def changed() -> None:  # from the watcher's thread
            loop.call_soon_threadsafe(broadcaster.poke)

        fleet.on_change = changed

        def end_streams() -> None:  # from the signal handler
            loop.call_soon_threadsafe(lambda: loop.create_task(broadcaster.close()))

        fleet.end_streams = end_streams
        task = asyncio.create_task(broadcaster.run())
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

    async def free(request: Request) -> Response:
        query = dict(request.query_params)
        return await answer(lambda: fleet.read(lambda view: free_answer(view, query)))

    async def broken(request: Request) -> Response:
        query = dict(request.query_params)
        return await answer(lambda: fleet.read(lambda view: broken_answer(view, query)))

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
        kind = request.query_params.get("snapshot", "status")
        if kind not in ("status", "grid") or set(request.query_params) - {"snapshot"}:
            wrong = InvalidInput("/api/v1/events takes snapshot=status (the default) or grid")
            code, document = error_answer(wrong)
            return JSONResponse(document, status_code=code)
        snapshot = fleet.grid_document if kind == "grid" else None
        stream = event_stream(state["broadcaster"], request.is_disconnected, snapshot)
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(stream, media_type="text/event-stream", headers=headers)

    async def metrics(_request: Request) -> Response:
        body = await asyncio.to_thread(fleet.metrics)
        return Response(body, media_type=CONTENT_TYPE)

    routes = [
        Route("/", index),
        static_route(),
        Route("/api/v1/status", status),
        Route("/api/v1/fleet", fleet_grid),
        Route("/api/v1/hosts/{host}", host),
        Route("/api/v1/free", free),
        Route("/api/v1/broken", broken),
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
