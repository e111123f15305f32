"""The agent's own decisions in the host's history: what is recorded, and how it is written."""

from __future__ import annotations

import queue
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from allocator.agent.config import AgentConfig
from allocator.agent.planning.types import DesiredJob, GiveUp, Pin, Stop
from allocator.agent.sync.history_decisions import DecisionRecorder
from allocator.agent.sync.history_queue import PER_TICK, HistoryQueue, write_pending
from allocator.agent.sync.store_thread import StoreLink
from allocator.errors import PermissionDenied, StoreUnavailable, ValueTooLarge
from allocator.history.stream import read_history
from allocator.policy.model import HistorySettings
from allocator.records.codec import replace_struct
from allocator.records.keys import KeyLayout
from allocator.records.types import Assignment, HistoryEntry
from allocator.store import Compare, Op, Store, open_store
from tests.support.waiting import wait_for

HOST = "node1"
AT = "2026-06-01T12:00:00Z"
LAYOUT = KeyLayout()
TRAIN = Assignment(
    job="train", host=HOST, gpus=(2,), mode="gpu", updated_by="alice@h", updated_at=AT
)


def _want(state: str = "run", device: str = "cuda", revision: int = 7, **fields: Any) -> DesiredJob:
    base = DesiredJob(
        job="train",
        state=state,  # type: ignore[arg-type]
        workers=(),
        fingerprint="f",
        on_change="restart",
        grace_seconds=1.0,
        max_restarts=3,
        backoff_base=1.0,
        backoff_max=2.0,
        gpus=(2,) if device == "cuda" else (),
        device=device,  # type: ignore[arg-type]
        fallback_reason=None,
        message="",
        assignment_revision=revision,
    )
    return replace(base, **fields)


ON_GPU = _want()
ON_CPU = _want(device="cpu", fallback_reason="GPU 2 unhealthy: XID 79")
WAITING = _want(state="wait", message="GPU 2 unhealthy: XID 79; waiting for it to recover")
FAILED = _want(state="failed", message="GPU 2 unhealthy; job 'train' failed")


def _changes(
    before: DesiredJob, after: DesiredJob, pins: dict[str, Pin] | None = None
) -> list[HistoryEntry]:
    recorder = DecisionRecorder(HOST)
    return recorder.desired_changed(
        {"train": before}, {"train": after}, pins or {}, {"train": TRAIN}, AT
    )


# --- what the agent records ----------------------------------------------------------------


def test_moving_off_an_unhealthy_gpu_to_the_cpu_is_a_fallback_with_the_reason() -> None:
    (entry,) = _changes(ON_GPU, ON_CPU)
    assert (entry.action, entry.from_mode, entry.from_gpus, entry.to_mode) == (
        "fallback",
        "gpu",
        (2,),
        "cpu",
    )
    assert entry.reason == "GPU 2 unhealthy: XID 79"
    assert (entry.by, entry.host, entry.job, entry.at) == ("agent@node1", HOST, "train", AT)


def test_stopping_to_wait_for_a_gpu_is_a_fallback_to_stopped() -> None:
    (entry,) = _changes(ON_GPU, WAITING)
    assert (entry.action, entry.to_mode) == ("fallback", "stopped")
    assert "waiting for it to recover" in entry.reason


def test_returning_to_its_gpus_is_a_recovery_naming_what_it_recovered_from() -> None:
    (entry,) = _changes(ON_CPU, ON_GPU)
    assert (entry.action, entry.from_mode, entry.to_mode, entry.to_gpus) == (
        "recover",
        "cpu",
        "gpu",
        (2,),
    )
    assert "GPU 2 unhealthy: XID 79" in entry.reason


def test_a_fail_rule_marking_the_job_failed_is_giving_up() -> None:
    (entry,) = _changes(ON_GPU, FAILED)
    assert (entry.action, entry.to_mode, entry.reason) == ("gave-up", "stopped", FAILED.message)


def test_nothing_is_recorded_when_the_place_stays_or_the_assignment_changed() -> None:
    assert _changes(ON_GPU, replace(ON_GPU, message="other")) == []
    assert _changes(ON_GPU, replace(ON_CPU, assignment_revision=8)) == []  # the operator's move
    assert (
        DecisionRecorder(HOST).desired_changed({}, {"train": ON_CPU}, {}, {"train": TRAIN}, AT)
        == []
    )


def test_a_job_on_a_cpu_assignment_has_no_fallback_to_record() -> None:
    on_cpu = replace_struct(TRAIN, mode="cpu", gpus=())
    recorder = DecisionRecorder(HOST)
    assert (
        recorder.desired_changed({"train": ON_GPU}, {"train": ON_CPU}, {}, {"train": on_cpu}, AT)
        == []
    )


def test_a_flap_hold_is_recorded_once_and_not_again_after_an_agent_restart() -> None:
    pin = {"train": Pin({2: "XID 79"}, "GPU 2 flapped: 4 health-driven restarts")}
    recorder = DecisionRecorder(HOST)
    (held,) = recorder.desired_changed(
        {"train": ON_CPU}, {"train": ON_CPU}, pin, {"train": TRAIN}, AT
    )
    assert (held.action, held.from_mode, held.to_mode) == ("held", "cpu", "cpu")
    assert "flapped" in held.reason
    assert (
        recorder.desired_changed({"train": ON_CPU}, {"train": ON_CPU}, pin, {"train": TRAIN}, AT)
        == []
    )
    restarted = DecisionRecorder(HOST, pinned=pin)
    assert restarted.desired_changed({}, {"train": ON_CPU}, pin, {"train": TRAIN}, AT) == []


def test_giving_up_on_a_crash_loop_is_recorded_from_where_it_ran() -> None:
    recorder = DecisionRecorder(HOST)
    actions = [
        GiveUp("train", "worker 0 exited with 1; gave up after 3 crash restarts"),
        Stop("x", "r", 1),
    ]
    (entry,) = recorder.actions(actions, {"train": ON_CPU}, {"train": TRAIN}, AT)
    assert (entry.action, entry.from_mode, entry.to_mode) == ("gave-up", "cpu", "stopped")
    assert "crash restarts" in entry.reason


# --- how the link writes them --------------------------------------------------------------


class Flaky:
    """A store whose transactions fail with ``error`` while ``failing`` is set."""

    def __init__(self, store: Store, error: Exception) -> None:
        self._store = store
        self.error = error
        self.failing = True

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> int:
        if self.failing:
            raise self.error
        return self._store.txn(compares, ops)


def _entry(job: str) -> HistoryEntry:
    return HistoryEntry(seq=0, at=AT, by="agent@node1", action="fallback", host=HOST, job=job)


def _written(store: Store) -> list[str | None]:
    found = read_history(store, LAYOUT, lambda bad: None, host=HOST, with_policy=False)
    return [s.entry.job for s in reversed(found)]


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, fields: dict[str, Any]) -> None:
        self.lines.append((event, fields))


def test_entries_stay_queued_through_an_outage_and_are_written_in_order_after() -> None:
    store = open_store(f"memory://{uuid.uuid4().hex}")
    flaky, log = Flaky(store, StoreUnavailable("down")), Log()
    pending = HistoryQueue(log)
    pending.add([_entry("a"), _entry("b")], HistorySettings(10))

    with pytest.raises(StoreUnavailable):
        write_pending(flaky, LAYOUT, HOST, pending, log)  # type: ignore[arg-type]
    assert len(pending) == 2 and _written(store) == []
    flaky.failing = False
    assert write_pending(flaky, LAYOUT, HOST, pending, log) == 2  # type: ignore[arg-type]

    assert _written(store) == ["a", "b"] and len(pending) == 0


def test_the_agents_append_drops_entries_past_the_policys_max_age() -> None:
    store, log = open_store(f"memory://{uuid.uuid4().hex}"), Log()
    pending = HistoryQueue(log)
    old = replace_struct(_entry("old"), at="2026-01-01T00:00:00Z")  # months before AT
    pending.add([old, _entry("kept")], HistorySettings(10))
    assert write_pending(store, LAYOUT, HOST, pending, log) == 2

    pending.add([_entry("new")], HistorySettings(10, max_age_seconds=30 * 86_400))
    write_pending(store, LAYOUT, HOST, pending, log)

    assert _written(store) == ["kept", "new"]


def test_a_full_queue_drops_the_oldest_and_says_so() -> None:
    log = Log()
    pending = HistoryQueue(log, capacity=3)
    pending.add([_entry(f"j{i}") for i in range(5)], None)
    assert len(pending) == 3 and pending.dropped == 2
    ((event, fields),) = log.lines
    assert event == "history-dropped" and fields["entries"] == 2 and "j0" in fields["oldest"]
    first = pending.peek()
    assert first is not None and first[0].job == "j2"


def test_a_refused_write_drops_the_entry_with_a_hint_instead_of_blocking_the_link() -> None:
    store = open_store(f"memory://{uuid.uuid4().hex}")
    log = Log()
    pending = HistoryQueue(log)
    pending.add([_entry("a")], HistorySettings(10))
    refusing = Flaky(store, PermissionDenied("permission denied"))
    assert write_pending(refusing, LAYOUT, HOST, pending, log) == 1  # type: ignore[arg-type]
    assert len(pending) == 0
    assert [e for e, _ in log.lines] == ["history-refused"]
    assert LAYOUT.history in log.lines[0][1]["hint"]


def test_a_backlog_is_written_a_bounded_number_per_tick() -> None:
    store = open_store(f"memory://{uuid.uuid4().hex}")
    pending = HistoryQueue(Log())
    pending.add([_entry(f"j{i}") for i in range(PER_TICK + 3)], None)
    assert write_pending(store, LAYOUT, HOST, pending, Log()) == PER_TICK
    assert write_pending(store, LAYOUT, HOST, pending, Log()) == 3


def test_the_store_link_writes_what_the_loop_hands_it(prefix: str) -> None:
    url = f"memory://{uuid.uuid4().hex}"
    config = AgentConfig(host=HOST, prefix=prefix)
    inbox: queue.Queue[Any] = queue.Queue()
    link = StoreLink(config, url, Log(), inbox, open_store=open_store)
    link.start()
    try:
        link.record_history([_entry("a")], HistorySettings(5))
        store = open_store(url)
        layout = KeyLayout(prefix)
        wait_for(
            "the entry in the store",
            lambda: read_history(store, layout, lambda bad: None, host=HOST, with_policy=False),
        )
    finally:
        assert link.close(keep_worker_records=False, timeout=5)


def test_entries_the_store_never_took_are_named_when_the_agent_stops(prefix: str) -> None:
    def unreachable(url: str) -> Store:
        raise StoreUnavailable("connection refused")

    log = Log()
    config = AgentConfig(host=HOST, prefix=prefix)
    link = StoreLink(config, "memory://x", log, queue.Queue(), open_store=unreachable)
    link.start()
    link.record_history([_entry("a"), _entry("b")], HistorySettings(5))
    assert link.close(keep_worker_records=False, timeout=5)
    unwritten = [fields for event, fields in log.lines if event == "history-unwritten"]
    assert [f["entries"] for f in unwritten] == [2]


class RefusesOnce(Flaky):
    """The store answers its first history transaction with a refusal, then takes them."""

    def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> int:
        if self.failing and any(LAYOUT.history in op.key for op in ops):
            self.failing = False
            raise self.error
        return self._store.txn(compares, ops)


def test_a_refused_request_leaves_the_link_connected() -> None:
    url = f"memory://{uuid.uuid4().hex}"
    store, log = open_store(url), Log()
    refusing = RefusesOnce(store, ValueTooLarge("value too large for the store"))
    link = StoreLink(
        AgentConfig(host=HOST),
        url,
        log,
        queue.Queue(),
        open_store=lambda u: refusing,  # type: ignore[arg-type,return-value]
    )
    link.start()
    try:
        link.record_history([_entry("a")], HistorySettings(5))
        wait_for("the refusal", lambda: any(e == "request-refused" for e, _ in log.lines))
        link.record_history([_entry("b")], HistorySettings(5))
        wait_for("both entries written", lambda: _written(store) == ["a", "b"])
    finally:
        assert link.close(keep_worker_records=False, timeout=5)
    events = [event for event, _ in log.lines]
    assert events.count("store-connected") == 1, log.lines  # never dropped, never reconnected
    assert "store-error" not in events
