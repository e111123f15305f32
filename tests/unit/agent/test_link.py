"""The agent's store link: retry timing and watch threads feeding one queue."""

from __future__ import annotations

import queue
import random

from allocator.agent.sync.watches import Message, RetryTimer, WatchError, WatchEvents, start_watches
from allocator.errors import StoreUnavailable
from allocator.store import Store, open_store
from tests.support.waiting import wait_for


def test_retry_delays_grow_are_jittered_and_capped() -> None:
    random.seed(1234)  # tenacity draws the jitter from `random`: make the draw repeatable
    timer = RetryTimer(cap_seconds=4.0, base_seconds=0.5)
    delays = [timer.failed(100.0) - 100.0 for _ in range(200)]
    assert all(0.0 <= d <= 4.0 for d in delays)
    assert (
        max(delays[:2]) <= 2.0 < max(delays[100:])
    )  # early retries are quick, later ones back off
    assert len(set(delays)) > 1  # with jitter, agents do not retry in lock-step


def test_backoff_is_not_forgiven_by_a_connect_that_fails_again_soon() -> None:
    random.seed(99)
    timer = RetryTimer(cap_seconds=8.0, base_seconds=0.5)
    now = 0.0
    for _ in range(6):  # connects, then fails a moment later, again and again
        now = timer.failed(now)
        timer.connected(now)
        now += 0.1
    assert timer.failures == 6
    assert timer.failed(now) - now <= 8.0


def test_backoff_is_forgiven_after_a_healthy_period() -> None:
    timer = RetryTimer(cap_seconds=8.0, base_seconds=0.5)
    for _ in range(5):
        timer.failed(0.0)
    timer.connected(100.0)
    timer.failed(100.0 + 8.0)  # up for the whole healthy period: a fresh outage
    assert timer.failures == 1


def test_a_refused_permission_is_retried_at_the_cap() -> None:
    timer = RetryTimer(cap_seconds=30.0)
    assert timer.failed_slowly(10.0) == 40.0


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
