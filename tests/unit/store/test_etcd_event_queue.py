"""The queue between a watch's reader thread and ``next()``: no server needed."""

from __future__ import annotations

import threading

import pytest

from allocator.errors import Compacted, StoreError, StoreUnavailable
from allocator.store.base import Event
from allocator.store.etcd.event_queue import EventQueue

JOIN_S = 10.0  # a hang guard for helper threads, not a timing


def put_event(key: str, revision: int) -> Event:
    return Event("put", key, b"v", revision)


def test_an_empty_queue_returns_an_empty_batch_after_the_timeout() -> None:
    assert EventQueue().next(0.05) == []


def test_batches_queued_before_next_come_back_together_in_order() -> None:
    queue = EventQueue()
    queue.put([put_event("/a", 5), put_event("/b", 5)])
    queue.put([put_event("/a", 6)])

    assert [(e.key, e.revision) for e in queue.next(1)] == [("/a", 5), ("/b", 5), ("/a", 6)]
    assert queue.next(0.01) == []


def test_events_before_an_error_are_delivered_then_the_error_every_time() -> None:
    queue = EventQueue()
    queue.put([put_event("/a", 7)])
    queue.fail(StoreUnavailable("gone"))
    queue.put([put_event("/late", 8)])  # after the error: dropped

    assert [e.key for e in queue.next(1)] == ["/a"]
    for _ in range(2):
        with pytest.raises(StoreUnavailable, match="gone"):
            queue.next(1)


def test_the_first_error_wins() -> None:
    queue = EventQueue()
    queue.fail(Compacted("compacted", compact_revision=9))
    queue.fail(StoreUnavailable("later"))

    with pytest.raises(Compacted) as caught:
        queue.next(1)
    assert caught.value.compact_revision == 9


def test_an_event_from_another_thread_wakes_a_waiting_next() -> None:
    queue = EventQueue()
    got: list[list[Event]] = []
    waiter = threading.Thread(target=lambda: got.append(queue.next(JOIN_S)))
    waiter.start()

    queue.put([put_event("/a", 1)])
    waiter.join(JOIN_S)

    assert not waiter.is_alive()
    assert [e.key for e in got[0]] == ["/a"]


def test_close_wakes_a_waiting_next_which_then_raises() -> None:
    queue = EventQueue()
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            queue.next(JOIN_S * 3)
        except StoreError as exc:
            raised.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert queue.close() is True
    waiter.join(JOIN_S)

    assert not waiter.is_alive()
    assert len(raised) == 1 and "closed" in str(raised[0])
    assert queue.close() is False  # idempotent
