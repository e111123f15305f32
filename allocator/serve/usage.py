"""``/api/v1/usage``: the document of ``allocator usage -o json``; the page's top users and teams.

The usage rollup's days are read on request, as ``allocator usage`` reads
them (:mod:`allocator.history.rollup`; history whole before the rollup was
rebuilt), and the holdings found are kept for :data:`KEEP_SECONDS`: every
query in that time whose window the read covers (any grouping or limit) is
counted from that one read, so neither a page open on many screens nor a
client varying its query costs more than one read per interval.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from allocator.errors import AllocatorError, InvalidInput
from allocator.records.keys import KeyLayout
from allocator.serve.history import error_answer
from allocator.store import Store

if TYPE_CHECKING:  # the report's code loads on the first usage request, not at serve's start
    from allocator.records.types import Assignment
    from allocator.serve.mirror import FleetMirror
    from allocator.status.usage_report import UsageRead

__all__ = ["KEEP_SECONDS", "UsageAnswers", "mirrored_assignments"]

#: How long one answer serves the same query.
KEEP_SECONDS = 30.0
#: Most rows one answer carries (``limit=``; the report says how many there were).
MAX_ROWS = 1000


class UsageAnswers:
    """Answers to usage queries, every query from one read kept a while (thread-safe)."""

    def __init__(
        self,
        open_store: Callable[[], Store],
        layout: KeyLayout,
        clock: Callable[[], float] = time.monotonic,
        current: Callable[[], Iterable[Assignment]] | None = None,
    ) -> None:
        self._open_store = open_store
        self._layout = layout
        # The assignments that exist now, from serve's mirror: not the fleet read again.
        self._current = current
        self._clock = clock
        self._lock = threading.Lock()  # one read at a time: the others wait for its answer
        self._kept: tuple[float, UsageRead] | None = None

    def answer(self, query: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        """(HTTP status, document) for ``?since=30d&by=user&limit=N&jobs=list``.

        ``jobs=count``: each row carries ``job_count`` instead of its every job's
        name (the page's top users and teams: a few hundred bytes a row, not the
        thousands of names a busy team's row lists), and a team's row its
        ``members`` (the page links the row to their jobs).
        """
        from allocator.history.stream import parse_since
        from allocator.status.usage_report import usage_document
        from allocator.util.times import utc_now

        try:
            since_text, by, limit = _parsed(query)
            counted = _jobs_counted(query)
            since = parse_since(since_text, utc_now())  # refused before any read
            read = self._read(since)
            since = parse_since(since_text, read.now)
        except AllocatorError as exc:
            return error_answer(exc)
        document = usage_document(read, since, by, limit)[0]
        if counted:
            document["rows"] = [_counted(row) for row in document["rows"]]
        if counted and by == "team":
            teams = read.policy.teams if read.policy is not None else {}
            for row in document["rows"]:  # whose jobs the page links a team's row to
                team = teams.get(row["key"])
                row["members"] = sorted(team.members) if team is not None else []
        return 200, document

    def _read(self, since: datetime) -> UsageRead:
        """The kept read, or a new one when it is :data:`KEEP_SECONDS` old or starts too late."""
        with self._lock:
            now = self._clock()
            kept = self._kept
            if kept is not None and now - kept[0] < KEEP_SECONDS and _covers(kept[1], since):
                return kept[1]
            # A minute early: the kept read still covers the same window asked again.
            read = self._read_store(since - timedelta(minutes=1))
            self._kept = (now, read)
            return read

    def _read_store(self, since: datetime) -> UsageRead:
        from allocator.control.client import Allocator
        from allocator.status.usage_report import read_usage
        from allocator.util.times import utc_now

        store = self._open_store()
        try:
            current = self._current() if self._current is not None else None
            client = Allocator(store, prefix=self._layout.prefix)
            return read_usage(client, utc_now(), since, current)
        finally:
            store.close()


def mirrored_assignments(mirror: FleetMirror) -> Iterator[Assignment]:
    """The assignments serve's mirror holds now, each decoded as it is counted."""
    from allocator.status.usage_report import assignments_in

    return assignments_in(mirror.assignment_items(), mirror.layout)


def _covers(read: UsageRead, since: datetime) -> bool:
    """Whether ``read`` counts every holding a window from ``since`` needs."""
    return read.since is None or read.since <= since


def _jobs_counted(query: Mapping[str, str]) -> bool:
    jobs = query.get("jobs", "list")
    if jobs not in ("list", "count"):
        raise InvalidInput(f"jobs={jobs!r}: expected list or count")
    return jobs == "count"


def _counted(row: dict[str, Any]) -> dict[str, Any]:
    jobs = row.pop("jobs")
    return {**row, "job_count": len(jobs)}


def _parsed(query: Mapping[str, str]) -> tuple[str, str, int]:
    from allocator.history.usage import BY

    since = query.get("since", "30d")
    by = query.get("by", "user")
    if by not in BY:
        raise InvalidInput(f"by={by!r}: expected one of {', '.join(BY)}")
    raw = query.get("limit", str(MAX_ROWS))
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_ROWS:
        raise InvalidInput(f"limit={raw!r}: expected a whole number from 1 to {MAX_ROWS}")
    return since, by, int(raw)
