"""The agent's MASTER_PORT table: the ports of :mod:`allocator.placement.ports`, kept on disk.

The table is saved in the agent's state directory, so a job keeps its port
across restarts of the agent (a changed port changes the workers'
environment, which restarts them). A port counts as free when a bind on it
works.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Collection, Mapping
from contextlib import suppress
from pathlib import Path

from allocator.placement.ports import allocate_master_ports, shared_declared_ports
from allocator.policy.model import Policy
from allocator.records.types import Assignment

__all__ = ["PortTable", "port_is_free"]

Logger = Callable[[str, dict[str, object]], None]


def port_is_free(port: int) -> bool:
    """Whether nothing on this host listens on TCP ``port`` (a bind on every address works)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


class PortTable:
    """The agent's MASTER_PORT table: allocated, logged, saved to its state directory."""

    def __init__(
        self, path: Path, log: Logger, *, is_free: Callable[[int], bool] = port_is_free
    ) -> None:
        """Load the table saved by an earlier run of the agent (a bad file is ignored)."""
        self.path = path
        self._log = log
        self._is_free = is_free
        self.ports: dict[str, int] = _load(path)
        self._warned: dict[int, list[str]] = {}
        # The inputs of the last allocation: the loop asks every tick, and the answer
        # changes only with them (a port found taken is probed again once they do).
        self._last: tuple[Policy, str, dict[str, Assignment], frozenset[str]] | None = None

    def allocate(
        self,
        policy: Policy,
        host: str,
        assignments: Mapping[str, Assignment],
        running: Collection[str],
    ) -> dict[str, int]:
        """The ports now; saves and logs the table when it changed."""
        last, inputs = self._last, (policy, host, dict(assignments), frozenset(running))
        if last is not None and last[0] is policy and last[1:] == inputs[1:]:
            return dict(self.ports)
        ports = allocate_master_ports(
            policy, host, assignments, self.ports, is_free=self._is_free, running=running
        )
        self._last = inputs
        shared = shared_declared_ports(policy, host, assignments)
        if shared != self._warned:
            self._warned = shared
            for port, jobs in shared.items():
                self._log("master-port-shared", {"port": port, "jobs": jobs})
        if ports != self.ports:
            self._log("master-ports", {"ports": dict(ports)})
            self.ports = ports
            self._save()
        return dict(ports)

    def _save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(self.ports, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError as exc:
            self._log("state-write-failed", {"path": str(self.path), "error": str(exc)})


def _load(path: Path) -> dict[str, int]:
    with suppress(OSError, ValueError):
        data = json.loads(path.read_text())
        if isinstance(data, dict):
            return {
                str(job): port
                for job, port in data.items()
                if isinstance(port, int) and not isinstance(port, bool)
            }
    return {}
