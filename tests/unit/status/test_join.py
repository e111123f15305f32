"""build_status: the pure join behind `allocator status`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from allocator.policy.model import Host, Policy, Reservation
from allocator.records.gpu_info import GpuInfo
from allocator.records.keys import KeyLayout
from allocator.records.types import AgentRecord, Assignment, WorkerRecord
from allocator.status.join import build_status
from allocator.store import KeyValue

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
LAYOUT = KeyLayout("/a")
POLICY = Policy(
    version=1,
    hosts={"n1": Host("n1", 4), "n2": Host("n2", 2)},
    reservations=(
        Reservation("nightly", "n1", (3,), ("eval-*",), until=NOW + timedelta(days=1)),
        Reservation("old", "n1", (2,), ("x",), until=NOW - timedelta(days=1)),
    ),
)


def _kv(key: str, raw: bytes, lease: int | None = None) -> KeyValue:
    return KeyValue(key, raw, 1, 1, lease)


def _assignment(job: str, host: str, gpus: tuple[int, ...], mode: str = "gpu") -> KeyValue:
    record = Assignment(
        job=job,
        host=host,
        gpus=gpus,
        mode=mode,  # type: ignore[arg-type]
        updated_by="ops@x",
        updated_at="2026-06-01T11:00:00Z",
        reason="why",
    )
    return _kv(LAYOUT.assignment(host, job), record.to_json())


def _agent(host: str, *, lease: int | None = 7, **extra: object) -> KeyValue:
    record = AgentRecord(
        host=host,
        gpus=tuple(GpuInfo(i) for i in range(4)),
        **extra,  # type: ignore[arg-type]
    )
    return _kv(LAYOUT.agent(host), record.to_json(), lease)


def _worker(job: str, host: str, gpus: tuple[int, ...], device: str = "cuda") -> KeyValue:
    record = WorkerRecord(job=job, host=host, state="running", pids=(42,), gpus=gpus, device=device)
    return _kv(LAYOUT.workers(host, job), record.to_json())


def test_every_declared_host_and_gpu_is_listed_with_its_holder() -> None:
    items = [_assignment("train", "n1", (1, 0))]
    n1, n2 = build_status(POLICY, items, LAYOUT, NOW)
    assert [(g.gpu, g.holder) for g in n1.gpus] == [
        ("0", "train"),
        ("1", "train"),
        ("2", None),
        ("3", None),
    ]
    assert n1.gpus[0].since == "2026-06-01T11:00:00Z" and n1.gpus[0].reason == "why"
    assert [g.gpu for g in n2.gpus] == ["0", "1"]


def test_active_reservations_are_labelled_and_expired_ones_are_not() -> None:
    (n1,) = build_status(POLICY, [], LAYOUT, NOW, only_host="n1")
    labels = {g.gpu: g.reserved for g in n1.gpus}
    assert labels["3"] == "nightly (eval-*)" and labels["2"] is None


def test_agent_liveness_is_its_leased_key_not_a_clock() -> None:
    leased = [_agent("n1")]
    flagged = [_agent("n1", store_stale=True)]
    by_hand = [_agent("n1", lease=None)]
    damaged = [_kv(LAYOUT.agent("n1"), b"{not json", lease=7)]
    orphaned = [_worker("train", "n1", (0,))]
    states = [
        build_status(POLICY, i, LAYOUT, NOW, "n1")[0].agent
        for i in (leased, flagged, by_hand, damaged, orphaned, [])
    ]
    assert states == ["alive", "stale", "unleased", "alive", "gone", "none"]


def test_an_agent_whose_clock_is_behind_is_alive_while_its_lease_lives() -> None:
    # What an agent whose clock runs a minute behind the operator's wrote (older
    # agents stamped a heartbeat time): its lease, not the time, says it lives.
    skewed = (NOW - timedelta(seconds=60)).strftime("%Y-%m-%dT%H:%M:%SZ")
    raw = f'{{"host":"n1","gpus":[],"heartbeat_at":"{skewed}","schema_version":1}}'
    items = [_kv(LAYOUT.agent("n1"), raw.encode(), lease=7)]
    assert build_status(POLICY, items, LAYOUT, NOW, "n1")[0].agent == "alive"


def test_unhealthy_gpus_show_their_reason() -> None:
    items = [_agent("n1", unhealthy={2: "XID 79"})]
    (n1,) = build_status(POLICY, items, LAYOUT, NOW, "n1")
    assert {g.gpu: g.health for g in n1.gpus}["2"] == "unhealthy: XID 79"


def test_cpu_jobs_get_a_cpu_row_and_jobs_say_whether_workers_match() -> None:
    items = [
        _assignment("train", "n1", (0,)),
        _worker("train", "n1", (1,)),  # still on the old GPU
        _assignment("notebook", "n1", (), mode="cpu"),
        _worker("notebook", "n1", (), device="cpu"),
        _assignment("eval-a", "n1", (3,)),
    ]
    (n1,) = build_status(POLICY, items, LAYOUT, NOW, "n1")
    assert ("cpu", "notebook") in [(g.gpu, g.holder) for g in n1.gpus]
    matches = {j.job: j.matches for j in n1.jobs}
    assert matches == {"eval-a": None, "notebook": True, "train": False}


def test_a_job_on_cpu_fallback_is_in_sync_and_says_why() -> None:
    fallback = WorkerRecord(
        job="train",
        host="n1",
        state="running",
        pids=(7,),
        gpus=(),
        device="cpu",
        fallback_reason="GPU 1 unhealthy: XID 79",
    )
    waiting = WorkerRecord(
        job="waiter", host="n1", state="wait", gpus=(2,), message="GPU 2 unhealthy: XID 48"
    )
    items = [
        _assignment("train", "n1", (1,)),
        _kv(LAYOUT.workers("n1", "train"), fallback.to_json()),
        _assignment("waiter", "n1", (2,)),
        _kv(LAYOUT.workers("n1", "waiter"), waiting.to_json()),
    ]
    (n1,) = build_status(POLICY, items, LAYOUT, NOW, "n1")
    rows = {j.job: j for j in n1.jobs}
    assert rows["train"].matches is True
    assert rows["train"].workers == "running pid 7 on CPU (GPU 1 unhealthy: XID 79)"
    assert rows["waiter"].workers == "wait: GPU 2 unhealthy: XID 48"


def test_hosts_known_only_from_the_store_are_listed_too() -> None:
    items = [_agent("n9")]
    names = [h.host for h in build_status(POLICY, items, LAYOUT, NOW)]
    assert names == ["n1", "n2", "n9"]


def test_a_shared_gpu_shows_its_slots_in_use_and_every_holder() -> None:
    from allocator.policy.model import Job, Pool, Sharing

    policy = Policy(
        version=1,
        hosts={"n1": Host("n1", 3, pool="p")},
        pools={"p": Pool("p", ("n1",), sharing=Sharing("mps", 4))},
        jobs={"a": Job("a", ("a",)), "b": Job("b", ("b",))},
    )

    def holding(job: str, gpus: tuple[int, ...], **extra: object) -> KeyValue:
        record = Assignment(job, "n1", gpus, "gpu", "ops@x", "t", **extra)  # type: ignore[arg-type]
        return _kv(LAYOUT.assignment("n1", job), record.to_json())

    items = [
        holding("a", (0,), picked="NVLink pair"),
        holding("b", (0,), slots=2),
        holding("c", (1,), exclusive=True),
    ]
    (n1,) = build_status(policy, items, LAYOUT, NOW)
    assert [(g.gpu, g.holder, g.slots) for g in n1.gpus] == [
        ("0", "a,b(2)", "3/4 slots"),
        ("1", "c(whole)", "4/4 slots"),
        ("2", None, "0/4 slots"),  # free: every slot of it
    ]
    assert [j.picked for j in n1.jobs] == ["NVLink pair", None, None]


def test_a_job_across_hosts_says_plainly_which_share_has_no_agent() -> None:
    from allocator.status.join import HostStatus, JobRow, group_status

    nodes = ("n1", "n2", "n3")

    def row(host: str) -> JobRow:
        return JobRow(host, "ring", "0", "gpu", "t", "ops", "", "running pid 7", True, nodes, 29500)

    hosts = [
        HostStatus("n1", "alive", (), (row("n1"),)),
        HostStatus("n2", "gone", (), (row("n2"),)),
    ]
    (group,) = group_status(hosts)  # n3 not read: no agent and no share of it
    assert group.summary() == (
        "ring across n1,n2,n3 (MASTER_PORT 29500): n1 rank 0 gpus 0: running pid 7; "
        "n2 rank 1 gpus 0, AGENT GONE: last reported running pid 7; n3 rank 2 NO SHARE, no agent"
    )


def test_a_host_name_no_policy_allows_written_by_hand_is_shown_with_its_bad_records() -> None:
    items = [
        _kv("/a/v1/hosts/-x/agent", b"{}", lease=5),
        _kv("/a/v1/hosts/bad name/jobs/t", b"{}"),
        _assignment("train", "n1", (0,)),
    ]
    hosts = {h.host: h for h in build_status(POLICY, items, LAYOUT, NOW)}
    assert (hosts["-x"].agent, hosts["bad name"].agent) == ("alive", "none")  # a leased key
    assert "no schema_version" in hosts["-x"].bad_records[0]
    assert "no schema_version" in hosts["bad name"].bad_records[0]
    assert [g.holder for g in hosts["n1"].gpus][:1] == ["train"]
