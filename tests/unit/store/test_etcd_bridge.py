"""The sync-over-asyncio plumbing under the etcd backend: no server needed."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from allocator.errors import Compacted, StoreError, StoreUnavailable
from allocator.store.base import Event
from allocator.store.etcd.grpc_bridge import EventQueue, LoopThread, SharedLoop

JOIN_S = 10.0  # a hang guard for helper threads, not a timing


def put_event(key: str, revision: int) -> Event:
    return Event("put", key, b"v", revision)


# --- EventQueue ------------------------------------------------------------------


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


# --- LoopThread --------------------------------------------------------------------


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    thread = LoopThread(name="test-loop")
    yield thread
    thread.stop(JOIN_S)


def test_run_returns_the_coroutine_result(loop_thread: LoopThread) -> None:
    async def answer() -> tuple[int, str]:
        await asyncio.sleep(0)
        return 42, threading.current_thread().name

    assert loop_thread.run(answer(), JOIN_S, "test") == (42, "test-loop")


def test_run_raises_the_coroutine_exception(loop_thread: LoopThread) -> None:
    async def refuse() -> None:
        raise StoreError("refused")

    with pytest.raises(StoreError, match="refused"):
        loop_thread.run(refuse(), JOIN_S, "test")


def test_a_call_past_its_deadline_is_unavailable_and_cancelled(loop_thread: LoopThread) -> None:
    cancelled = threading.Event()

    async def hang() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(StoreUnavailable, match="somewhere did not answer"):
        loop_thread.run(hang(), 0.05, "somewhere")
    assert cancelled.wait(JOIN_S)


def test_stop_ends_the_thread_and_later_calls_say_closed() -> None:
    thread = LoopThread(name="test-loop-stopping")
    pending = threading.Event()

    async def forever() -> None:
        pending.set()
        await asyncio.Event().wait()

    thread.call_soon(lambda: thread.loop.create_task(forever()))
    assert pending.wait(JOIN_S)
    thread.stop(JOIN_S)

    assert "test-loop-stopping" not in {t.name for t in threading.enumerate()}

    async def late() -> int:
        return 1

    with pytest.raises(StoreError, match="closed"):
        thread.run(late(), JOIN_S, "test")


def test_calls_from_many_threads_at_once_each_get_their_own_result(
    loop_thread: LoopThread,
) -> None:
    gate = threading.Barrier(8)
    results: dict[int, int] = {}

    async def echo(value: int) -> int:
        await asyncio.sleep(0)
        return value

    def caller(index: int) -> None:
        gate.wait(JOIN_S)
        results[index] = sum(loop_thread.run(echo(index * 100 + n), JOIN_S, "t") for n in range(50))

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_S)
    assert results == {i: i * 100 * 50 + sum(range(50)) for i in range(8)}


# --- SharedLoop --------------------------------------------------------------------


def test_users_of_a_shared_loop_get_one_thread_that_ends_with_the_last_release() -> None:
    shared = SharedLoop("test-shared-loop")
    first, second = shared.acquire(), shared.acquire()
    assert first is second
    assert [t.name for t in threading.enumerate()].count("test-shared-loop") == 1

    shared.release(first, JOIN_S)
    assert "test-shared-loop" in {t.name for t in threading.enumerate()}

    async def one() -> int:
        return 1

    assert second.run(one(), JOIN_S, "test") == 1  # still running for its other user
    shared.release(second, JOIN_S)
    assert "test-shared-loop" not in {t.name for t in threading.enumerate()}


def test_a_shared_loop_starts_afresh_after_its_last_user_left() -> None:
    shared = SharedLoop("test-shared-again")
    old = shared.acquire()
    shared.release(old, JOIN_S)
    new = shared.acquire()
    try:
        assert new is not old

        async def one() -> int:
            return 1

        assert new.run(one(), JOIN_S, "test") == 1
    finally:
        shared.release(new, JOIN_S)
