"""A share of a job across hosts: ranks, MASTER_ADDR, and the whole job's failure rules."""

from __future__ import annotations

import queue
import uuid
from collections.abc import Mapping
from typing import Any

import pytest

from allocator.agent.config import AgentConfig
from allocator.agent.planning.across_hosts import PeerHost, PeerShare, peer_from_listing, peer_jobs
from allocator.agent.planning.desired import desired_jobs
from allocator.agent.planning.desired_inputs import DesiredInputs
from allocator.agent.planning.types import DesiredJob
from allocator.agent.sync.host_records import HostView
from allocator.agent.sync.link_phase import Watching
from allocator.agent.sync.reports import worker_records
from allocator.agent.sync.store_thread import StoreLink
from allocator.errors import PermissionDenied
from allocator.placement.ports import allocate_master_ports
from allocator.policy.model import FallbackRule, Job, Policy
from allocator.records.gpu_info import GpuInfo
from allocator.records.keys import KeyLayout
from allocator.records.types import AgentRecord, Assignment, WorkerRecord
from allocator.status.join import GroupStatus, HostStatus, JobRow, group_status
from allocator.store import KeyValue, Store, open_store

NODES = ("node1", "node2", "node3")
PORT = 24000
REVISION = 7
INVENTORY = tuple(GpuInfo(index=i, uuid=f"GPU-{i:04d}") for i in range(4))
LAYOUT = KeyLayout("/a")


def share(host: str, gpus: tuple[int, ...] = (0, 1), nodes: tuple[str, ...] = NODES) -> Assignment:
    """``host``'s share of job train across ``nodes``."""
    return Assignment(
        job="train",
        host=host,
        gpus=gpus,
        mode="gpu",
        updated_by="ops",
        updated_at="t",
        nodes=nodes,
        master_port=PORT,
    )


def policy(rule: str | None = "wait", workers: str = "per-gpu") -> Policy:
    job = Job(name="train", command=("python", "t.py"), workers=workers, fallback=rule)  # type: ignore[arg-type]
    rules = {
        name: FallbackRule(name, name, 2 if name == "cpu" else None)
        for name in ("wait", "cpu", "fail")
    }  # type: ignore[arg-type]
    return Policy(version=1, jobs={"train": job}, fallback=rules)


def peer(
    host: str,
    *,
    state: str = "running",
    fault: str | None = None,
    revision: int = REVISION,
    address: str | None = None,
    master_addr: str | None = None,
    nodes: tuple[str, ...] = NODES,
) -> PeerHost:
    """Another host as its agent reports it."""
    worker = WorkerRecord(
        job="train",
        host=host,
        state=state,
        fault=fault,
        assignment_revision=revision,
        master_addr=master_addr,
    )
    shares = {"train": PeerShare(share(host, nodes=nodes), REVISION, worker)}
    return PeerHost(host, True, True, address, shares)


def decide(
    host: str,
    peers: Mapping[str, PeerHost],
    *,
    pol: Policy | None = None,
    unhealthy: Mapping[int, str] | None = None,
    failed: Mapping[str, int] | None = None,
) -> DesiredJob:
    """What ``host``'s agent (advertising 10.0.0.1) wants for its share."""
    return desired_jobs(
        DesiredInputs(
            pol or policy(),
            host,
            {"train": share(host)},
            {"train": REVISION},
            INVENTORY,
            unhealthy or {},
            failed or {},
            peers=peers,
            address="10.0.0.1",
        )
    )["train"]


def everyone_fine() -> dict[str, PeerHost]:
    return {h: peer(h, address=f"10.0.0.{i + 1}") for i, h in enumerate(NODES)}


# --- ranks and rendezvous ------------------------------------------------------------


def test_per_gpu_workers_get_global_ranks_and_the_first_hosts_address() -> None:
    want = decide("node2", everyone_fine())
    envs = [w.env for w in want.workers]
    assert [(e["RANK"], e["LOCAL_RANK"], e["GROUP_RANK"]) for e in envs] == [
        ("2", "0", "1"),
        ("3", "1", "1"),
    ]
    assert {
        (e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs
    } == {("6", "2", "10.0.0.1", str(PORT))}
    assert {(e["ALLOCATOR_NODE_RANK"], e["ALLOCATOR_NNODES"]) for e in envs} == {("1", "3")}


def test_a_single_worker_share_gets_what_torchrun_needs_to_start_its_ranks() -> None:
    want = decide("node3", everyone_fine(), pol=policy(workers="single"))
    (worker,) = want.workers
    assert {k: worker.env[k] for k in ("ALLOCATOR_NODE_RANK", "ALLOCATOR_NNODES")} == {
        "ALLOCATOR_NODE_RANK": "2",
        "ALLOCATOR_NNODES": "3",
    }
    assert (worker.env["MASTER_ADDR"], worker.env["MASTER_PORT"]) == ("10.0.0.1", str(PORT))
    assert "RANK" not in worker.env


def test_the_first_host_advertises_its_own_address_as_master_addr() -> None:
    want = decide("node1", {})
    assert {w.env["MASTER_ADDR"] for w in want.workers} == {"10.0.0.1"}


def test_master_addr_comes_from_rank_0s_worker_record_while_its_agent_is_away() -> None:
    gone = peer("node1", master_addr="10.9.9.9")
    want = decide("node2", {"node1": gone})
    assert {w.env["MASTER_ADDR"] for w in want.workers} == {"10.9.9.9"}


def test_a_share_waits_while_rank_0s_address_is_unknown() -> None:
    want = decide("node2", {"node1": PeerHost("node1", readable=False)})
    assert want.state == "wait" and not want.workers
    assert "address of node1" in want.message and "may not read" in want.message


def test_single_host_per_gpu_jobs_keep_their_environment() -> None:
    alone = Assignment(
        job="train", host="node1", gpus=(0,), mode="gpu", updated_by="o", updated_at="t"
    )
    want = desired_jobs(DesiredInputs(policy(), "node1", {"train": alone}, {}, INVENTORY, {}, {}))[
        "train"
    ]
    assert "GROUP_RANK" not in want.workers[0].env  # no restart of running jobs on upgrade
    assert "ALLOCATOR_NODE_RANK" not in want.workers[0].env


# --- failure rules apply to the whole job ------------------------------------------------


def test_a_fault_on_another_host_stops_this_share_under_a_wait_rule() -> None:
    peers = everyone_fine()
    peers["node1"] = peer("node1", fault="GPU 0 unhealthy: XID 79", address="10.0.0.1")
    want = decide("node2", peers)
    assert want.state == "wait" and not want.workers
    assert "node1: GPU 0 unhealthy: XID 79" in want.message
    assert want.fault is None  # a follower publishes no fault of its own


def test_a_fault_on_another_host_moves_this_share_to_cpu_under_a_cpu_rule() -> None:
    peers = everyone_fine()
    peers["node3"] = peer("node3", fault="GPU 1 unhealthy: lost", address="10.0.0.3")
    want = decide("node2", peers, pol=policy("cpu"))
    (worker,) = want.workers  # one CPU worker per host: the world is the node count
    assert want.device == "cpu" and worker.env["CUDA_VISIBLE_DEVICES"] == ""
    assert (worker.env["RANK"], worker.env["WORLD_SIZE"]) == ("1", "3")
    assert worker.env["ALLOCATOR_FALLBACK_REASON"].startswith("node3: GPU 1 unhealthy")


def test_a_fault_on_another_host_fails_this_share_under_a_fail_rule() -> None:
    peers = everyone_fine()
    peers["node1"] = peer("node1", fault="GPU 0 unhealthy: XID 48", address="10.0.0.1")
    assert decide("node3", peers, pol=policy("fail")).state == "failed"


def test_a_share_that_failed_elsewhere_fails_this_one_too() -> None:
    peers = everyone_fine()
    peers["node2"] = peer("node2", state="failed")
    want = decide("node1", peers)
    assert want.state == "failed" and "share on node2 failed" in want.message


def test_this_hosts_own_fault_is_published_for_the_other_shares() -> None:
    want = decide("node2", everyone_fine(), unhealthy={1: "XID 79"})
    assert want.state == "wait" and want.fault == "GPU 1 unhealthy: XID 79"
    (raw,) = worker_records("node2", {"train": want}, {}).values()
    assert WorkerRecord.from_json(raw).fault == "GPU 1 unhealthy: XID 79"


def test_a_share_that_only_follows_is_not_followed_back() -> None:
    peers = everyone_fine()
    peers["node1"] = peer("node1", state="wait", address="10.0.0.1")  # waiting, no fault
    assert decide("node2", peers).state == "run"


def test_reports_about_another_assignment_are_ignored() -> None:
    peers = everyone_fine()
    peers["node1"] = peer("node1", fault="GPU 0 gone", revision=REVISION - 1, address="a")
    peers["node3"] = peer("node3", state="failed", nodes=("node1", "node2", "node3", "x"))
    assert decide("node2", peers).state == "run"


def test_with_no_fallback_rule_a_share_runs_on_unless_a_reservation_stops_another() -> None:
    assert (
        decide("node2", everyone_fine(), pol=policy(None), unhealthy={0: "XID 79"}).state == "run"
    )
    peers = everyone_fine()
    peers["node1"] = peer("node1", fault="GPU 0 reserved by 'r'", address="10.0.0.1")
    assert decide("node2", peers, pol=policy(None)).state == "wait"


# --- what the agent reads of other hosts ---------------------------------------------------


def test_a_peer_is_read_from_one_listing_of_its_keys() -> None:
    agent = AgentRecord(host="node1", gpus=(), address="gpu-a.example")
    items = [
        KeyValue(LAYOUT.agent("node1"), agent.to_json(), 3, 3, lease=42),
        KeyValue(LAYOUT.assignment("node1", "train"), share("node1").to_json(), 5, 5),
        KeyValue(LAYOUT.workers("node1", "train"), b"{not json", 6, 6),
    ]
    found, bad = peer_from_listing(items, LAYOUT, "node1", ["train"])
    assert (found.agent_alive, found.address) == (True, "gpu-a.example")
    assert found.shares["train"].revision == 5 and found.shares["train"].worker is None
    assert [error.key for error, _rev in bad] == [LAYOUT.workers("node1", "train")]


def test_each_other_host_is_read_for_the_jobs_it_shares() -> None:
    alone = Assignment(
        job="solo", host="node2", gpus=(3,), mode="gpu", updated_by="o", updated_at="t"
    )
    assert peer_jobs({"train": share("node2"), "solo": alone}, "node2") == {
        "node1": ("train",),
        "node3": ("train",),
    }


class RefusingPeers:
    """A store that lets the agent read only its own host's keys."""

    def __init__(self, store: Store, own: str) -> None:
        self._store = store
        self._own = own

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def list(self, prefix: str) -> Any:
        if prefix.startswith(LAYOUT.hosts) and prefix != LAYOUT.host(self._own):
            raise PermissionDenied(f"no read access to {prefix}")
        return self._store.list(prefix)


def test_a_peer_the_store_will_not_show_is_unknown_and_said_once() -> None:
    store = RefusingPeers(open_store(f"memory://{uuid.uuid4().hex}"), "node2")
    store.put(LAYOUT.assignment("node2", "train"), share("node2").to_json())
    logged: list[tuple[str, dict[str, Any]]] = []
    to_loop: queue.Queue[Any] = queue.Queue()
    link = StoreLink(
        AgentConfig(host="node2", prefix="/a"),
        "memory://x",
        lambda event, fields: logged.append((event, fields)),
        to_loop,
        open_store=lambda url: store,  # type: ignore[arg-type,return-value]
    )
    try:
        link._read(store, 0.0)  # type: ignore[arg-type]
        link._read(store, 1.0)  # type: ignore[arg-type]
    finally:
        link._stop_watches()
    view: HostView = to_loop.get_nowait()
    assert view.peers["node1"].readable is False and isinstance(link.phase, Watching)
    assert [fields["peer"] for event, fields in logged if event == "peer-unreadable"] == [
        "node1",
        "node3",
    ]
    assert link.watched_peers == ()  # a refused watch would drop the agent's connection


# --- ports and status ----------------------------------------------------------------------


def test_the_first_host_keeps_its_other_jobs_off_the_jobs_port() -> None:
    other = Job(name="other", command=("x",), workers="per-gpu")
    pol = Policy(version=1, jobs={"train": policy().jobs["train"], "other": other})
    mine = {
        "train": share("node1"),
        "other": Assignment(
            job="other", host="node1", gpus=(3,), mode="gpu", updated_by="o", updated_at="t"
        ),
    }
    ports = allocate_master_ports(pol, "node1", mine, {"other": PORT})
    assert "train" not in ports and ports["other"] != PORT


def test_status_shows_a_job_across_hosts_as_one_line_naming_a_gone_agent() -> None:
    def host(name: str, agent: str, rows: tuple[JobRow, ...]) -> HostStatus:
        return HostStatus(name, agent, (), rows)

    def row(name: str, workers: str) -> JobRow:
        return JobRow(name, "train", "0,1", "gpu", "t", "ops", "", workers, True, NODES, PORT)

    (group,) = group_status(
        [
            host("node1", "alive", (row("node1", "running pid 10"),)),
            host("node2", "gone", (row("node2", "running pid 11"),)),
            host("node3", "alive", ()),
        ]
    )
    assert isinstance(group, GroupStatus)
    assert group.summary() == (
        f"train across node1,node2,node3 (MASTER_PORT {PORT}): node1 rank 0 gpus 0,1: "
        "running pid 10; node2 rank 1 gpus 0,1, AGENT GONE: last reported running pid 11; "
        "node3 rank 2 NO SHARE"
    )


@pytest.mark.parametrize("bad", [("node1",), ("node1", "node1"), ("node2", "node3")])
def test_an_assignment_with_impossible_nodes_is_a_bad_record(bad: tuple[str, ...]) -> None:
    from allocator.errors import BadRecord
    from allocator.records.codec import decode_record

    raw = (
        share("node1")
        .to_json()
        .replace(b'"node1","node2","node3"', ",".join(f'"{n}"' for n in bad).encode())
    )
    with pytest.raises(BadRecord):
        decode_record(raw, Assignment, "k", job="train", host="node1")


def test_the_agent_advertises_its_master_addr_else_its_host_name() -> None:
    import socket

    from allocator.agent.config import load_agent_config

    default = load_agent_config(None, {"host": "node1"})
    assert (default.local_master_addr, default.advertised_address) == (
        "127.0.0.1",
        socket.gethostname(),
    )
    chosen = load_agent_config(None, {"host": "node1", "master_addr": "10.0.0.21"})
    assert (chosen.local_master_addr, chosen.advertised_address) == ("10.0.0.21", "10.0.0.21")


@pytest.mark.parametrize("bad", ["10.0.0.1 evil", "tcp://10.0.0.1", "", "-x"])
def test_a_master_addr_that_is_no_address_is_refused_in_one_line(bad: str) -> None:
    from allocator.agent.config import load_agent_config
    from allocator.errors import InvalidInput

    with pytest.raises(InvalidInput, match="master_addr must be a host name or an IP address"):
        load_agent_config(None, {"host": "node1", "master_addr": bad})
