"""``/api/v1/history``: the same document as ``allocator history -o json``.

History entries live in their own keys (a stream per host), read on request
the way the CLI reads them: they are not mirrored, so a large fleet's
history costs no memory here. One request returns at most
:data:`MAX_LIMIT` entries, :data:`DEFAULT_LIMIT` without ``limit``: a
request never reads the whole of a fleet's history.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from allocator.errors import AllocatorError
from allocator.records.keys import KeyLayout, validate_name
from allocator.store import Store

if TYPE_CHECKING:
    from allocator.errors import BadRecord
    from allocator.history.stream import Stored

__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "error_answer", "history_json"]

#: Entries one request returns without ``limit``.
DEFAULT_LIMIT = 100
#: The most entries one request may ask for.
MAX_LIMIT = 1000


class _Query(Protocol):
    """``query_history``: the newest entries matching the filters, newest first."""

    def __call__(
        self,
        store: Store,
        layout: KeyLayout,
        on_bad: Callable[[BadRecord], None],
        *,
        host: str | None,
        job: str | None,
        gpu: int | None,
        since: datetime | None,
        limit: int | None,
        now: datetime | None,
    ) -> Sequence[Stored]: ...


#: ``parse_since``: ``30m``, ``7d`` or an RFC 3339 time, before the given now.
_Since = Callable[[str, datetime], datetime]
#: ``history_document``: the entries as ``allocator history -o json`` prints them.
_Render = Callable[[Sequence["Stored"]], dict[str, Any]]

_LABELS = {2: "error", 4: "store unavailable", 5: "permission denied", 6: "not found"}


def _error(code: int, message: str) -> dict[str, Any]:
    return {"error": _LABELS.get(code, "internal error"), "exit_code": code, "message": message}


def error_answer(exc: AllocatorError) -> tuple[int, dict[str, Any]]:
    """(HTTP status, error document) of a failed read: the CLI's exit code, translated."""
    status = {2: 400, 4: 503, 5: 403, 6: 404}.get(exc.exit_code, 500)
    return status, _error(exc.exit_code, str(exc))


def history_json(
    open_store: Callable[[], Store], layout: KeyLayout, query: Mapping[str, str]
) -> tuple[int, dict[str, Any]]:
    """(HTTP status, document) for a history request with ``query``'s filters."""
    # Looked up here, not at import: serve's start loads no history code until asked.
    from allocator.history.read import query_history
    from allocator.history.stream import parse_since
    from allocator.status.documents import history_document as render

    try:
        return 200, _read(parse_since, query_history, render, open_store, layout, query)
    except AllocatorError as exc:
        return error_answer(exc)


def _read(
    parse_since: _Since,
    query_history: _Query,
    render: _Render,
    open_store: Callable[[], Store],
    layout: KeyLayout,
    query: Mapping[str, str],
) -> dict[str, Any]:
    from allocator.util.times import utc_now

    job = validate_name(query["job"], "job") if "job" in query else None
    host = validate_name(query["host"], "host") if "host" in query else None
    gpu = _count(query["gpu"], "gpu") if "gpu" in query else None
    limit = _count(query["limit"], "limit") if "limit" in query else DEFAULT_LIMIT
    if not 1 <= limit <= MAX_LIMIT:
        raise _invalid(f"limit={limit}: expected a whole number from 1 to {MAX_LIMIT}")
    since = parse_since(query["since"], utc_now()) if "since" in query else None
    store = open_store()
    try:
        chosen = query_history(
            store,
            layout,
            lambda _bad: None,
            host=host,
            job=job,
            gpu=gpu,
            since=since,
            limit=limit,
            now=utc_now(),
        )
    finally:
        store.close()
    return render(chosen)


def _count(raw: str, what: str) -> int:
    if not raw.isdigit():
        raise _invalid(f"{what}={raw!r}: expected a whole number")
    return int(raw)


def _invalid(message: str) -> AllocatorError:
    from allocator.errors import InvalidInput

    return InvalidInput(message)
