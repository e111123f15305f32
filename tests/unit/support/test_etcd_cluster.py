"""The 3-member etcd cluster fixture: one leader, a killed leader replaced, a frozen one passed by.

These run real etcd processes; the store client under test is the
project's own, given all three endpoints.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from allocator.errors import StoreUnavailable
from allocator.store import Store, open_store
from tests.support.etcd_cluster import ClusterMember, EtcdCluster
from tests.support.waiting import wait_for


@pytest.fixture
def store(etcd_cluster: EtcdCluster) -> Iterator[Store]:
    opened = open_store(etcd_cluster.url)
    try:
        yield opened
    finally:
        opened.close()


def _put(store: Store, key: str, value: bytes) -> bool:
    """Write, or say it could not yet (a new leader is being elected)."""
    try:
        store.put(key, value)
    except StoreUnavailable:
        return False
    return True


def _term(member: ClusterMember) -> int:
    status = member.status()
    assert status is not None
    return int(str(status["raftTerm"]))


def test_the_members_agree_on_one_leader_and_the_url_names_all_three(
    etcd_cluster: EtcdCluster,
) -> None:
    leader = etcd_cluster.leader()
    assert leader in etcd_cluster.members
    assert etcd_cluster.url == "etcd://" + ",".join(m.endpoint for m in etcd_cluster.members)
    assert len({m.client_port for m in etcd_cluster.members}) == 3


def test_a_killed_leader_is_replaced_and_rejoins_as_a_follower(
    etcd_cluster: EtcdCluster, store: Store, prefix: str
) -> None:
    store.put(f"{prefix}/k", b"before")
    term_before = _term(etcd_cluster.leader())
    killed = etcd_cluster.kill_leader()
    assert killed.pid is not None, "the killed leader was not started again"
    assert _term(etcd_cluster.leader()) > term_before, "no new election"
    # Raft keeps what was committed; the cluster takes writes again.
    wait_for("a write after the leader's death", lambda: _put(store, f"{prefix}/k", b"after"))
    item = store.get(f"{prefix}/k")
    assert item is not None and item.value == b"after"
    status = killed.status()
    assert status is not None, "the restarted member does not answer"


def test_a_frozen_member_leaves_the_other_two_serving(
    etcd_cluster: EtcdCluster, store: Store, prefix: str
) -> None:
    frozen = etcd_cluster.members[0]
    frozen.pause()
    try:
        assert frozen.status() is None  # it answers nothing while frozen
        wait_for("a write with one member frozen", lambda: _put(store, f"{prefix}/k", b"v"))
        item = store.get(f"{prefix}/k")
        assert item is not None and item.value == b"v"
        leader = etcd_cluster.leader()
        assert leader is not frozen
    finally:
        frozen.resume()
    wait_for("the thawed member to answer", frozen.status)


def test_a_port_taken_before_the_bind_gives_the_cluster_fresh_ports(tmp_path: Path) -> None:
    cluster = EtcdCluster(tmp_path / "cluster")
    taken = cluster.members[1].peer_port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        cluster.start()
        try:
            assert cluster.members[1].peer_port != taken
            assert cluster.leader() in cluster.members
        finally:
            cluster.stop()
