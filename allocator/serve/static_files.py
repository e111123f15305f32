"""The status page's static files: its scripts and the vendored charting library.

Read once from the package when the application is built (a few files, some
tens of kilobytes), answered from memory with an ``ETag``, so a reload costs
a ``304``. The page's own scripts change with allocator and are revalidated
on each load (``no-cache``); the vendored library under ``vendor/`` changes
only with its version, and may be kept a day without asking.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from importlib.abc import Traversable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from allocator.errors import NotFound
from allocator.serve.history import error_answer

__all__ = ["StaticFile", "static_files", "static_route"]

#: What each file type is answered as; any other file is not served.
_MEDIA_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
_VENDOR_CACHE = "public, max-age=86400"
_OWN_CACHE = "no-cache"


@dataclass(frozen=True)
class StaticFile:
    """One file's bytes and the headers it is answered with."""

    body: bytes
    media_type: str
    etag: str
    cache_control: str


def static_files() -> dict[str, StaticFile]:
    """Every servable file under ``static/``, by its path there (``vendor/uplot/uPlot.min.css``)."""
    root = resources.files("allocator.serve").joinpath("static")
    return dict(_walk(root, ""))


def _walk(folder: Traversable, under: str) -> list[tuple[str, StaticFile]]:
    found: list[tuple[str, StaticFile]] = []
    for entry in folder.iterdir():
        path = f"{under}{entry.name}"
        if entry.is_dir():
            found += _walk(entry, path + "/")
            continue
        media_type = _MEDIA_TYPES.get("." + entry.name.rpartition(".")[2])
        if media_type is None:
            continue
        body = entry.read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        cache = _VENDOR_CACHE if path.startswith("vendor/") else _OWN_CACHE
        found.append((path, StaticFile(body, media_type, etag, cache)))
    return found


def static_route() -> Route:
    """``/static/{path}``: the files of :func:`static_files`, ``304`` when the ETag matches."""
    files = static_files()

    async def answer(request: Request) -> Response:
        found = files.get(request.path_params["path"])
        if found is None:
            code, document = error_answer(NotFound(f"no static file {request.url.path}"))
            return JSONResponse(document, status_code=code)
        headers = {"ETag": found.etag, "Cache-Control": found.cache_control}
        if request.headers.get("if-none-match") == found.etag:
            return Response(status_code=304, headers=headers)
        return Response(found.body, media_type=found.media_type, headers=headers)

    return Route("/static/{path:path}", answer)
