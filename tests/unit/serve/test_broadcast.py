"""The event stream: the whole document first, then each change's hosts only, built once
and shared; a stream that falls behind is told to resync."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime

from allocator.serve.broadcast import BACKLOG, Broadcaster, event_stream
from allocator.serve.fleet import Fleet
from allocator.store import Event, Store
from tests.unit.serve.test_fleet_view import LAYOUT, _held, _mirror

NOW = datetime(2027, 1, 1, tzinfo=UTC)


def _no_store() -> Store:
    raise AssertionError("the stream reads the mirror only")


async def _connected() -> bool:
    return False


async def _whole(stream: AsyncIterator[bytes]) -> bytes:
    """The stream's next event, its pieces joined."""
    raw = b""
    while not raw.endswith(b"\n\n"):
        raw += await anext(stream)
    return raw


def _event(raw: bytes) -> tuple[str, object]:
    name, data, blank = raw.split(b"\n", 2)
    assert blank == b"\n"
    return name.removeprefix(b"event: ").decode(), json.loads(data.removeprefix(b"data: "))


def test_a_one_host_change_sends_that_host_only_the_same_bytes_to_every_stream() -> None:
    mirror = _mirror()
    fleet = Fleet(_no_store, mirror, "etcd://x", wall=lambda: NOW)
    fleet.page_change()  # the whole view is built (and taken) before any stream opens

    async def scenario() -> tuple[list[bytes], list[bytes]]:
        broadcaster = Broadcaster(fleet.page_document, fleet.page_change)
        one = event_stream(broadcaster, _connected)
        two = event_stream(broadcaster, _connected)
        firsts = [await _whole(one), await _whole(two)]
        mirror.apply(
            [Event("put", LAYOUT.assignment("n2", "train"), _held("train", "n2", (1,)), 6)], {}
        )
        change = fleet.page_change()
        assert change is not None
        broadcaster.send(b"event: hosts\ndata: " + change + b"\n\n")
        return firsts, [await anext(one), await anext(two)]

    firsts, changes = asyncio.run(scenario())
    name, document = _event(firsts[0])
    assert name == "fleet" and isinstance(document, dict)
    assert [h["host"] for h in document["status"]["hosts"]] == ["n0", "n1", "n2"]
    assert changes[0] is changes[1]  # built once, shared
    name, delta = _event(changes[0])
    assert name == "hosts" and isinstance(delta, dict)
    assert [h["host"] for h in delta["hosts"]] == ["n2"] and delta["removed"] == []
    assert b'"host":"n0"' not in changes[0] and b'"host":"n1"' not in changes[0]
    assert delta["revision"] == 6 and delta["store"]["url"] == "etcd://x"


def test_a_removed_host_is_named_and_a_whole_rebuild_asks_for_a_resync() -> None:
    mirror = _mirror()
    fleet = Fleet(_no_store, mirror, "etcd://x", wall=lambda: NOW)
    assert fleet.page_change() is None  # the first build is of every host
    mirror.apply([Event("delete", LAYOUT.assignment("n0", "train"), None, 6)], {})
    change = fleet.page_change()
    assert change is not None and [h["host"] for h in json.loads(change)["hosts"]] == ["n0"]
    assert json.loads(fleet.page_change() or b"{}")["hosts"] == []  # nothing since


def test_a_stream_that_falls_behind_gets_resync_and_ends() -> None:
    async def scenario() -> list[bytes]:
        broadcaster = Broadcaster(lambda: iter([b"{}"]), lambda: b"{}")
        stream = event_stream(broadcaster, _connected)
        events = [await _whole(stream)]
        for n in range(BACKLOG + 1):
            broadcaster.send(b'event: hosts\ndata: {"n": %d}\n\n' % n)
        events += [raw async for raw in stream]
        return events

    events = asyncio.run(scenario())
    assert [_event(raw)[0] for raw in events] == ["fleet", "resync"]


def test_the_page_s_stream_starts_with_the_grid_and_each_change_carries_its_grid_rows() -> None:
    mirror = _mirror()
    fleet = Fleet(_no_store, mirror, "etcd://x", wall=lambda: NOW)
    fleet.page_change()

    async def scenario() -> tuple[bytes, bytes]:
        broadcaster = Broadcaster(fleet.page_document, fleet.page_change)
        stream = event_stream(broadcaster, _connected, fleet.grid_document)
        first = await _whole(stream)
        mirror.apply([Event("delete", LAYOUT.assignment("n0", "train"), None, 6)], {})
        change = fleet.page_change()
        assert change is not None
        broadcaster.send(b"event: hosts\ndata: " + change + b"\n\n")
        return first, await anext(stream)

    first, change = asyncio.run(scenario())
    name, document = _event(first)
    assert name == "fleet" and isinstance(document, dict) and "status" not in document
    grid = document["grid"]
    assert [row[0] for row in grid["hosts"]] == ["n0", "n1", "n2"]
    assert grid["hosts"][0][3] == "10" and document["store"]["url"] == "etcd://x"
    name, delta = _event(change)
    assert name == "hosts" and isinstance(delta, dict)
    assert delta["grid"] == [["n0", 0, "up", "00"]]  # train let GPU 0 go
