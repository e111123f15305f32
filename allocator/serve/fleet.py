"""What ``allocator serve`` shows: the mirror, its watcher, the view built from them, the series.

Every answer reads the view under its lock, the hosts changed since the last
read rebuilt first (:mod:`allocator.serve.fleet_view`); viewers never cause
store reads.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from allocator.serve.fleet_api import StatusQuery, fleet_json, metrics_text, status_json
from allocator.serve.fleet_view import FleetView
from allocator.serve.mirror import FleetMirror
from allocator.serve.select import select_hosts
from allocator.serve.series import COUNTED, DEFAULT_POINTS, DEFAULT_SAMPLE_SECONDS, Sample, Series
from allocator.serve.watcher import FleetWatcher
from allocator.store import Store
from allocator.util.times import format_time, utc_now

if TYPE_CHECKING:
    from allocator.status.summary import PoolSummary

__all__ = ["Fleet"]

_T = TypeVar("_T")


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

    def page_document(self) -> Iterator[bytes]:
        """An event stream's first document in pieces: status, store state, time, revision.

        Never whole in memory (tens of megabytes at 12,500 hosts); the hosts
        are those of the moment the first piece is asked for.
        """

        def build(view: FleetView) -> tuple[bytes | Iterator[bytes], bytes]:
            return status_json(view, StatusQuery({}), select_hosts), self._rest(view)

        status, rest = self.read(build)
        yield b'{"status":'
        if isinstance(status, bytes):
            yield status
        else:
            yield from status
        yield b"," + rest[1:]

    def grid_document(self) -> Iterator[bytes]:
        """An event stream's first document as the page asks for it: the fleet's grid
        (:func:`~allocator.serve.fleet_api.fleet_json`, a few hundred kB at 12,500
        hosts), store state, time, revision."""

        def build(view: FleetView) -> bytes:
            rest = self._rest(view)
            return b'{"grid":' + fleet_json(view, format_time(self.wall())) + b"," + rest[1:]

        yield self.read(build)

    def page_change(self) -> bytes | None:
        """The hosts changed since the last call, as an event stream sends them.

        ``{"revision", "hosts": [status items], "grid": [their grid rows],
        "removed": [names], "store", "loaded", "at"}``; ``None`` when every
        host was rebuilt (a stream must fetch the whole document again).
        """

        def build(view: FleetView) -> bytes | None:
            touched = view.take_touched()
            if touched is None:
                return None
            views = view.views
            kept = [views[name] for name in touched if name in views]
            hosts = b",".join(host.json for host in kept)
            grid = b",".join(host.grid_row for host in kept)
            removed = json.dumps([name for name in touched if name not in views]).encode()
            head = b'{"hosts":[' + hosts + b'],"grid":[' + grid + b'],"removed":' + removed + b","
            return head + self._rest(view)[1:]

        return self.read(build)

    def _rest(self, view: FleetView) -> bytes:
        rest = {
            "revision": view.revision,
            "store": {"url": self.url, **self.watcher.state.to_dict()},
            "loaded": self.mirror.loaded,
            "at": format_time(self.wall()),
        }
        return json.dumps(rest).encode()

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


def _counted(row: PoolSummary) -> dict[str, int]:
    return {name: getattr(row, name) for name in COUNTED}
