"""What the agent reads (view) and writes (publisher): bad keys skipped, idle writes none."""

from __future__ import annotations

from typing import Any

from allocator.agent.sync.host_records import host_view
from allocator.agent.sync.publisher import Publisher
from allocator.errors import PermissionDenied
from allocator.records.keys import KeyLayout
from allocator.records.types import Assignment, PolicyRecord
from allocator.store import KeyValue, Listing, Store
from allocator.store.memory import MemoryStore
from tests.support.clock import FakeClock

LAYOUT = KeyLayout("/a")
HOST = "n1"


def _assignment(job: str, gpus: tuple[int, ...] = (0,)) -> bytes:
    record = Assignment(job=job, host=HOST, gpus=gpus, mode="gpu", updated_by="x", updated_at="y")
    return record.to_json()


def _listing(*items: tuple[str, bytes]) -> Listing:
    return Listing(tuple(KeyValue(k, v, i + 1, i + 1) for i, (k, v) in enumerate(items)), 10)


def test_job_keys_that_name_no_valid_job_are_bad_records_not_errors() -> None:
    jobs = LAYOUT.host_jobs(HOST)
    view = host_view(
        _listing(
            (f"{jobs}train", _assignment("train")),
            (
                f"{jobs}train\n",
                b'{"job":"train\\n","host":"n1","gpus":[1],"mode":"gpu",'
                b'"updated_by":"x","updated_at":"y","schema_version":1}',
            ),
            (f"{jobs}zz/train", _assignment("train", (2,))),
            (f"{jobs}bad name!", _assignment("train")),
            (f"{jobs}", _assignment("train")),
        ),
        None,
        LAYOUT,
        HOST,
    )
    assert dict(view.assignments) == {"train": Assignment.from_json(_assignment("train"))}
    assert sorted(error.key for error, _rev in view.bad) == sorted(
        [f"{jobs}train\n", f"{jobs}zz/train", f"{jobs}bad name!", jobs]
    )
    assert all("valid job name" in error.reason for error, _rev in view.bad)


def test_the_agents_own_keys_are_collected_and_a_bad_policy_is_reported() -> None:
    own = LAYOUT.workers(HOST, "train")
    policy = KeyValue(LAYOUT.policy, b'{"yaml":"x","schema_version":1}', 5, 5)
    view = host_view(
        _listing((LAYOUT.agent(HOST), b"{}"), (own, b"{}"), (LAYOUT.host_generation(HOST), b"1")),
        policy,
        LAYOUT,
        HOST,
    )
    assert set(view.own) == {LAYOUT.agent(HOST), own}
    assert view.policy is None and view.policy_present
    assert [(error.key, revision) for error, revision in view.bad] == [(LAYOUT.policy, 5)]
    good = PolicyRecord.from_json(
        PolicyRecord(
            yaml="v",
            sha256="4c94485e0c21ae6c41ce1dfe7b6bfaceea5ab68e40a2476f50208e526f506080",
            applied_by="x",
            applied_at="y",
        ).to_json()
    )
    item = KeyValue(LAYOUT.policy, good.to_json(), 6, 6)
    assert host_view(_listing(), item, LAYOUT, HOST).policy == good


def _publisher(store: Store, logged: list[Any]) -> Publisher:
    publisher = Publisher(LAYOUT, HOST, lambda event, fields: logged.append(event))
    publisher.observe({item.key: item for item in store.list(LAYOUT.host(HOST)).items})
    return publisher


def test_an_unchanged_record_is_never_written_again() -> None:
    store = MemoryStore()
    publisher = _publisher(store, [])
    publisher.keep_alive(store, ttl=10)
    assert publisher.publish(store, b"agent-v1", {"train": b"w1"}) == 2
    revision = store.list("/").revision
    for _ in range(50):  # heartbeats: keep-alive only
        publisher.keep_alive(store, ttl=10)
        assert publisher.publish(store, b"agent-v1", {"train": b"w1"}) == 0
    assert store.list("/").revision == revision
    assert publisher.publish(store, b"agent-v2", {"train": b"w1"}) == 1


def test_what_someone_else_changed_or_left_behind_is_put_right_after_a_read() -> None:
    store = MemoryStore()
    stray = LAYOUT.workers(HOST, "gone-job")
    store.put(stray, b"from an earlier run")
    store.put(LAYOUT.agent(HOST), b"written by hand")  # no lease
    publisher = _publisher(store, [])
    publisher.keep_alive(store, ttl=10)
    assert publisher.publish(store, b"agent", {"train": b"w"}) == 3
    assert store.get(stray) is None
    agent = store.get(LAYOUT.agent(HOST))
    assert agent is not None and agent.value == b"agent" and agent.lease == publisher.lease
    store.put(LAYOUT.workers(HOST, "train"), b"tampered")
    publisher.observe({i.key: i for i in store.list(LAYOUT.host(HOST)).items})
    assert publisher.publish(store, b"agent", {"train": b"w"}) == 1
    assert publisher.publish(store, b"agent", None) == 0  # None: workers not known yet


def test_a_lost_lease_is_granted_again_and_the_record_put_back() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    logged: list[Any] = []
    publisher = _publisher(store, logged)
    publisher.keep_alive(store, ttl=5)
    publisher.publish(store, b"agent", {})
    clock.advance(60)  # the store was away longer than the TTL
    assert store.get(LAYOUT.agent(HOST)) is None
    publisher.keep_alive(store, ttl=5)
    assert logged == ["lease-lost"]
    assert publisher.publish(store, b"agent", {}) == 1
    item = store.get(LAYOUT.agent(HOST))
    assert item is not None and item.lease == publisher.lease


def test_a_longer_ttl_grants_a_new_lease_and_the_records_move_to_it() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    logged: list[Any] = []
    publisher = _publisher(store, logged)
    publisher.keep_alive(store, ttl=30)
    publisher.publish(store, b"agent", {})
    first = publisher.lease
    publisher.keep_alive(store, ttl=30)  # the same TTL: the lease is kept alive
    assert publisher.lease == first and logged == []
    publisher.keep_alive(store, ttl=195)  # the fleet's size is known: a longer lease
    assert publisher.lease != first and logged == ["lease-lengthened"]
    assert publisher.publish(store, b"agent", {}) == 1
    clock.advance(60)  # past the old lease's TTL, within the new one's
    item = store.get(LAYOUT.agent(HOST))
    assert item is not None and item.lease == publisher.lease


def test_withdraw_revokes_the_lease_and_drops_worker_records_unless_kept() -> None:
    store = MemoryStore()
    publisher = _publisher(store, [])
    publisher.keep_alive(store, ttl=10)
    publisher.publish(store, b"agent", {"train": b"w"})
    publisher.withdraw(store, keep_worker_records=True)
    assert store.get(LAYOUT.agent(HOST)) is None
    assert store.get(LAYOUT.workers(HOST, "train")) is not None
    publisher.withdraw(store, keep_worker_records=False)
    assert store.get(LAYOUT.workers(HOST, "train")) is None


def test_the_counts_go_under_the_lease_once_and_a_re_read_does_not_rewrite_them() -> None:
    store = MemoryStore()
    publisher = _publisher(store, [])
    publisher.keep_alive(store, ttl=10)
    assert publisher.publish(store, b"agent", {"train": b"w"}, b"counts-1") == 3
    item = store.get(LAYOUT.host_counts(HOST))
    assert item is not None and item.value == b"counts-1" and item.lease == publisher.lease
    # The periodic read sees only the host's prefix, where the counts are not.
    publisher.observe({i.key: i for i in store.list(LAYOUT.host(HOST)).items})
    assert publisher.publish(store, b"agent", {"train": b"w"}, b"counts-1") == 0
    assert publisher.publish(store, b"agent", None, None) == 0  # workers unknown: left alone
    assert publisher.publish(store, b"agent", {"train": b"w"}, b"counts-2") == 1
    assert publisher.publish(store, b"agent", {"train": b"w"}, None) == 1  # no GPUs: none kept
    assert store.get(LAYOUT.host_counts(HOST)) is None
    publisher.publish(store, b"agent", {"train": b"w"}, b"counts-3")
    publisher.withdraw(store, keep_worker_records=True)
    assert store.get(LAYOUT.host_counts(HOST)) is None


class _NoCounts(MemoryStore):
    """A store whose role for this agent leaves out the counts key."""

    def put(
        self,
        key: str,
        value: bytes,
        *,
        expect_revision: int | None = None,
        lease: int | None = None,
    ) -> int:
        if key.startswith(LAYOUT.counts):
            raise PermissionDenied(f"permission denied writing {key}")
        return super().put(key, value, expect_revision=expect_revision, lease=lease)


def test_counts_the_role_refuses_are_logged_once_and_the_rest_still_published() -> None:
    store = _NoCounts()
    logged: list[Any] = []
    publisher = _publisher(store, logged)
    publisher.keep_alive(store, ttl=10)
    assert publisher.publish(store, b"agent", {"train": b"w"}, b"counts") == 2
    assert publisher.publish(store, b"agent", {"train": b"w2"}, b"counts-2") == 1
    assert logged == ["counts-refused"]
    assert store.get(LAYOUT.agent(HOST)) is not None
    publisher.forget()  # a new connection tries again (a role may have been granted)
    publisher.publish(store, b"agent", {"train": b"w2"}, b"counts-2")
    assert logged == ["counts-refused", "counts-refused"]
