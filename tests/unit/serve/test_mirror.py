"""The fleet mirror behind ``allocator serve``: one read, then watch events, leases kept."""

from __future__ import annotations

from datetime import UTC, datetime

from allocator.records.gpu_info import GpuInfo
from allocator.records.host_counts import HostCounts
from allocator.records.keys import KeyLayout
from allocator.records.types import AgentRecord, Assignment
from allocator.serve.mirror import FleetMirror
from allocator.store import Event, KeyValue, Listing

LAYOUT = KeyLayout("/a")
NOW = datetime(2027, 1, 1, tzinfo=UTC)


def _held(job: str, gpu: int) -> bytes:
    return Assignment(
        job=job, host="n1", gpus=(gpu,), mode="gpu", updated_by="ops", updated_at="t"
    ).to_json()


def _agent() -> bytes:
    return AgentRecord(host="n1", gpus=(GpuInfo(0), GpuInfo(1))).to_json()


def _holders(mirror: FleetMirror) -> list[tuple[str, str, str]]:
    hosts, _ = mirror.status(NOW, lambda _bad: None)
    return [(h.agent, g.gpu, g.holder) for h in hosts for g in h.gpus]


def test_a_read_then_events_keep_the_fleet_current_and_ignore_other_keys() -> None:
    mirror = FleetMirror(LAYOUT)
    mirror.reset(
        Listing(
            (
                KeyValue(LAYOUT.agent("n1"), _agent(), 3, 3, lease=9),
                KeyValue(LAYOUT.assignment("n1", "train"), _held("train", 0), 4, 4),
                KeyValue("/a/v1/history/hosts/n1/000000000001", b"{}", 4, 4),
            ),
            4,
        )
    )
    assert _holders(mirror) == [("alive", "0", "train"), ("alive", "1", None)]
    changed = mirror.apply(
        [
            Event("delete", LAYOUT.assignment("n1", "train"), None, 5),
            Event("put", LAYOUT.assignment("n1", "eval"), _held("eval", 1), 5),
            Event("put", "/a/v1/jobs/eval", b"{}", 5),
        ],
        {},
    )
    assert changed and mirror.revision == 5
    assert _holders(mirror) == [("alive", "0", None), ("alive", "1", "eval")]
    assert not mirror.apply([Event("put", "/a/v1/jobs/x", b"{}", 6)], {})  # not kept
    assert mirror.revision == 6


def test_an_agent_key_is_alive_only_with_the_lease_the_watcher_looked_up() -> None:
    mirror = FleetMirror(LAYOUT)
    mirror.reset(Listing((), 1))
    mirror.apply([Event("put", LAYOUT.agent("n1"), _agent(), 2)], {LAYOUT.agent("n1"): None})
    assert _holders(mirror)[0][0] == "unleased"
    mirror.apply([Event("put", LAYOUT.agent("n1"), _agent(), 3)], {LAYOUT.agent("n1"): 77})
    assert _holders(mirror)[0][0] == "alive"
    mirror.apply([Event("delete", LAYOUT.agent("n1"), None, 4)], {})  # the lease expired
    assert _holders(mirror) == []  # nothing left of n1 (and no policy declares it)


def test_an_unreadable_policy_is_reported_and_status_goes_on_without_it() -> None:
    mirror = FleetMirror(LAYOUT)
    mirror.reset(
        Listing(
            (
                KeyValue(LAYOUT.policy, b"not json", 2, 2),
                KeyValue(LAYOUT.assignment("n1", "train"), _held("train", 0), 3, 3),
            ),
            3,
        )
    )
    bad: list[str] = []
    hosts, revision = mirror.status(NOW, bad.append)
    assert revision == 3 and [h.host for h in hosts] == ["n1"]
    assert bad and "policy record" in bad[0]


def _counts(host: str, gpus: int, utilisation: int | None) -> bytes:
    return HostCounts(host, tuple(range(gpus)), free=gpus, utilisation=utilisation).to_json()


def test_the_agents_counts_give_the_fleet_s_mean_utilisation_not_a_status_change() -> None:
    mirror = FleetMirror(LAYOUT)
    assert mirror.utilisation_percent() is None  # nothing reported: no point on the plot
    mirror.reset(Listing((KeyValue(LAYOUT.host_counts("n1"), _counts("n1", 8, 90), 2, 2, 9),), 2))
    assert mirror.utilisation_percent() == 90.0
    n2 = LAYOUT.host_counts("n2")
    assert not mirror.apply([Event("put", n2, _counts("n2", 2, 40), 3)], {})  # same status
    assert mirror.utilisation_percent() == 80.0  # weighted by GPUs: (8 x 90 + 2 x 40) / 10
    mirror.apply([Event("put", n2, b"garbage", 4)], {})
    assert mirror.utilisation_percent() == 90.0
    mirror.apply([Event("put", n2, _counts("n1", 2, 0), 5)], {})  # names another host
    assert mirror.utilisation_percent() == 90.0
    mirror.apply([Event("delete", LAYOUT.host_counts("n1"), None, 6)], {})  # its agent gone
    assert mirror.utilisation_percent() is None
