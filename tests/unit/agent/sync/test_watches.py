"""The agent's store link: watch threads feeding one queue."""

from __future__ import annotations

import dataclasses
import queue
from typing import get_args

import pytest

from allocator.agent.sync.messages import ToLink, ToLoop
from allocator.agent.sync.watches import Message, WatchError, WatchEvents, start_watches
from allocator.errors import StoreUnavailable
from allocator.store import Store, open_store
from tests.support.waiting import wait_for


def test_watches_on_two_prefixes_feed_one_queue(prefix: str) -> None:
    url = f"memory://{prefix.strip('/')}"
    writer = open_store(url)
    inbox: queue.Queue[Message] = queue.Queue()
    start = writer.put(f"{prefix}/other", b"x") + 1
    threads = start_watches(lambda: open_store(url), [f"{prefix}/a/", f"{prefix}/b"], start, inbox)
    try:
        writer.put(f"{prefix}/a/1", b"1")
        writer.put(f"{prefix}/b", b"2")
        seen: set[str] = set()

        def both() -> bool:
            while not inbox.empty():
                message = inbox.get_nowait()
                assert isinstance(message, WatchEvents)
                seen.update(e.key for e in message.events)
            return seen == {f"{prefix}/a/1", f"{prefix}/b"}

        wait_for("events from both watches", both, timeout=5)
    finally:
        for thread in threads:
            thread.stop()
        for thread in threads:
            thread.join(5)
        writer.close()


def test_a_store_that_cannot_be_opened_is_reported_not_raised(prefix: str) -> None:
    def broken() -> Store:
        raise StoreUnavailable("etcd at 127.0.0.1:1 is unavailable")

    inbox: queue.Queue[Message] = queue.Queue()
    threads = start_watches(broken, [f"{prefix}/a/"], 1, inbox)
    message = inbox.get(timeout=5)
    assert isinstance(message, WatchError)
    assert "unavailable" in str(message.error)
    threads[0].join(5)


@pytest.mark.parametrize("kind", [*get_args(ToLink), *get_args(ToLoop)])
def test_every_message_between_the_loop_and_the_link_is_frozen(kind: type) -> None:
    assert dataclasses.is_dataclass(kind) and kind.__dataclass_params__.frozen  # type: ignore[attr-defined]
