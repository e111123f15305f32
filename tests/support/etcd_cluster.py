"""A real three-member etcd cluster for tests: free loopback ports, own data dirs.

Each member is an :class:`~tests.support.etcd_server.EtcdServer` that knows
its peers. The cluster starts all three processes before waiting for any
(a member is healthy only once a quorum elected a leader), and offers the
faults a consistent store must survive: :meth:`EtcdCluster.leader` finds
the current leader (each member's ``/v3/maintenance/status``),
:meth:`EtcdCluster.kill_leader` SIGKILLs it and starts it again on the same
ports and data (it rejoins as a follower), and each member's ``pause()`` /
``resume()`` freeze and thaw it (SIGSTOP/SIGCONT).
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.etcd_server import EtcdNotAvailable, EtcdServer, free_port

__all__ = ["ClusterMember", "EtcdCluster"]

_STATUS_TIMEOUT_S = 1.0
_POLL_S = 0.05


class ClusterMember(EtcdServer):
    """One member of an :class:`EtcdCluster`: its name, ports and the whole cluster's peers."""

    def __init__(self, data_dir: Path, name: str, client_port: int, peer_port: int) -> None:
        super().__init__(data_dir)
        self.name = name
        self.client_port, self.peer_port = client_port, peer_port
        self.initial_cluster = ""

    def _command(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer_port}"
        client = self._client_url()
        return [
            self.binary,
            f"--name={self.name}",
            f"--data-dir={self.data_dir / 'data'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={self.initial_cluster}",
            "--initial-cluster-state=new",  # ignored once the data dir holds a member
            "--initial-cluster-token=allocator-test",
            "--logger=zap",
            # Short enough that a killed leader is replaced within about a second,
            # long enough that a loaded 2-core machine does not elect all the time.
            "--heartbeat-interval=100",
            "--election-timeout=1000",
        ]

    def spawn(self) -> None:
        """Start the process without waiting for it to be healthy."""
        self._spawn()

    def wait_healthy(self, timeout: float) -> None:
        """Wait until this member answers ``/health`` (it sees a leader)."""
        self._wait_healthy(timeout)

    def status(self) -> dict[str, object] | None:
        """This member's ``/v3/maintenance/status`` answer, or ``None`` if it gives none."""
        request = urllib.request.Request(
            f"{self._client_url()}/v3/maintenance/status", data=b"{}", method="POST"
        )
        try:
            with self._opener().open(request, timeout=_STATUS_TIMEOUT_S) as response:
                answer: dict[str, object] = json.loads(response.read())
                return answer
        except (OSError, urllib.error.URLError, ValueError):
            return None


class EtcdCluster:
    """Three etcd processes forming one cluster on loopback, owned by a test."""

    def __init__(self, data_dir: Path, size: int = 3) -> None:
        self.members = [
            ClusterMember(data_dir / f"m{i}", f"m{i}", free_port(), free_port())
            for i in range(size)
        ]
        self._introduce()

    def _introduce(self) -> None:
        """Tell every member the whole cluster's peer URLs."""
        peers = ",".join(f"{m.name}=http://127.0.0.1:{m.peer_port}" for m in self.members)
        for member in self.members:
            member.initial_cluster = peers

    @property
    def url(self) -> str:
        """The store URL naming every member (``etcd://h:p,h:p,h:p``)."""
        return "etcd://" + ",".join(m.endpoint for m in self.members)

    def start(self, timeout: float = 30) -> None:
        """Start every member, then wait until each is healthy.

        Another process may take a port between ``free_port()`` and a member's
        bind (a busy machine's outgoing connections use the same range): then
        the cluster starts again, from empty data, on fresh ports (three tries).
        """
        for attempt in range(3):
            try:
                self._start_once(timeout)
                return
            except EtcdNotAvailable as exc:
                if "address already in use" not in str(exc) or attempt == 2:
                    raise
            for member in self.members:
                shutil.rmtree(member.data_dir / "data", ignore_errors=True)
                member.client_port, member.peer_port = free_port(), free_port()
            self._introduce()

    def _start_once(self, timeout: float) -> None:
        for member in self.members:
            member.data_dir.mkdir(parents=True, exist_ok=True)
            member.spawn()
        try:
            for member in self.members:
                member.wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every member (a paused one is resumed first). Safe to call twice."""
        for member in self.members:
            member.stop()

    def leader(self, timeout: float = 15) -> ClusterMember:
        """The member every answering member names as leader, once there is one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self._agreed_leader()
            if found is not None:
                return found
            time.sleep(_POLL_S)
        raise EtcdNotAvailable(f"no leader after {timeout} s")

    def kill_leader(self, timeout: float = 30) -> ClusterMember:
        """SIGKILL the leader, start it again on its ports and data; return it."""
        member = self.leader()
        member.kill()
        member.restart(timeout)
        return member

    def _agreed_leader(self) -> ClusterMember | None:
        by_id: dict[int, ClusterMember] = {}
        named: set[int] = set()
        for member in self.members:
            if member.pid is None:
                continue
            status = member.status()
            if status is None:
                continue
            header = status.get("header")
            if not isinstance(header, dict):
                continue
            by_id[int(header["member_id"])] = member
            named.add(int(str(status.get("leader", 0))))
        if len(named) != 1:
            return None
        (leader,) = named
        return by_id.get(leader)
