"""Stored records and their JSON encoding.

Every record carries ``schema_version``; a reader refuses a newer version it
does not understand instead of misreading it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from allocator.errors import StoreError
from allocator.gpus.model import GpuInfo

__all__ = [
    "SCHEMA_VERSION",
    "AgentRecord",
    "Assignment",
    "PolicyRecord",
    "WorkerRecord",
    "decode",
]

SCHEMA_VERSION = 1


def decode(raw: bytes, what: str) -> dict[str, Any]:
    """Parse a stored JSON record, checking its schema_version."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise StoreError(f"stored {what} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise StoreError(f"stored {what} is not a JSON object")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise StoreError(
            f"stored {what} has schema_version {version!r}; this allocator reads "
            f"{SCHEMA_VERSION} (upgrade allocator)"
        )
    return data


def _encode(data: dict[str, Any]) -> bytes:
    return json.dumps({"schema_version": SCHEMA_VERSION, **data}, sort_keys=True).encode()


@dataclass(frozen=True, slots=True)
class Assignment:
    """Which GPUs a job holds on a host (``mode="cpu"``: it holds none, runs on CPU)."""

    job: str
    host: str
    gpus: tuple[int, ...]
    mode: Literal["gpu", "cpu"]
    updated_by: str
    updated_at: str
    reason: str = ""
    requested: str = ""
    policy_revision: int = 0
    command: tuple[str, ...] | None = None
    fallback_reason: str | None = None

    def to_json(self) -> bytes:
        """Encode for the store."""
        return _encode(
            {
                "job": self.job,
                "host": self.host,
                "gpus": list(self.gpus),
                "mode": self.mode,
                "updated_by": self.updated_by,
                "updated_at": self.updated_at,
                "reason": self.reason,
                "requested": self.requested,
                "policy_revision": self.policy_revision,
                "command": list(self.command) if self.command is not None else None,
                "fallback_reason": self.fallback_reason,
            }
        )

    @classmethod
    def from_json(cls, raw: bytes) -> Assignment:
        """Decode a stored assignment."""
        d = decode(raw, "assignment")
        command = d.get("command")
        return cls(
            job=d["job"],
            host=d["host"],
            gpus=tuple(int(g) for g in d.get("gpus", ())),
            mode="cpu" if d.get("mode") == "cpu" else "gpu",
            updated_by=d.get("updated_by", ""),
            updated_at=d.get("updated_at", ""),
            reason=d.get("reason", ""),
            requested=d.get("requested", ""),
            policy_revision=int(d.get("policy_revision", 0)),
            command=tuple(command) if command is not None else None,
            fallback_reason=d.get("fallback_reason"),
        )


@dataclass(frozen=True, slots=True)
class PolicyRecord:
    """The applied policy: its YAML text, hash, and who applied it when."""

    yaml: str
    sha256: str
    applied_by: str
    applied_at: str
    source: str = ""

    def to_json(self) -> bytes:
        """Encode for the store."""
        return _encode(
            {
                "yaml": self.yaml,
                "sha256": self.sha256,
                "applied_by": self.applied_by,
                "applied_at": self.applied_at,
                "source": self.source,
            }
        )

    @classmethod
    def from_json(cls, raw: bytes) -> PolicyRecord:
        """Decode a stored policy record."""
        d = decode(raw, "policy")
        return cls(
            yaml=d["yaml"],
            sha256=d["sha256"],
            applied_by=d.get("applied_by", ""),
            applied_at=d.get("applied_at", ""),
            source=d.get("source", ""),
        )


@dataclass(frozen=True, slots=True)
class AgentRecord:
    """What a host agent publishes under its lease: inventory, health, heartbeat."""

    host: str
    gpus: tuple[GpuInfo, ...]
    unhealthy: dict[int, str] = field(default_factory=dict)
    heartbeat_at: str = ""
    started_at: str = ""
    pid: int = 0
    version: str = ""
    store_stale: bool = False
    inventory_source: str = "nvml"

    def to_json(self) -> bytes:
        """Encode for the store."""
        return _encode(
            {
                "host": self.host,
                "gpus": [g.to_dict() for g in self.gpus],
                "unhealthy": {str(k): v for k, v in sorted(self.unhealthy.items())},
                "heartbeat_at": self.heartbeat_at,
                "started_at": self.started_at,
                "pid": self.pid,
                "version": self.version,
                "store_stale": self.store_stale,
                "inventory_source": self.inventory_source,
            }
        )

    @classmethod
    def from_json(cls, raw: bytes) -> AgentRecord:
        """Decode a stored agent record."""
        d = decode(raw, "agent record")
        return cls(
            host=d["host"],
            gpus=tuple(GpuInfo.from_dict(g) for g in d.get("gpus", ())),
            unhealthy={int(k): str(v) for k, v in d.get("unhealthy", {}).items()},
            heartbeat_at=d.get("heartbeat_at", ""),
            started_at=d.get("started_at", ""),
            pid=int(d.get("pid", 0)),
            version=d.get("version", ""),
            store_stale=bool(d.get("store_stale", False)),
            inventory_source=d.get("inventory_source", "nvml"),
        )


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """What the agent actually runs for one job."""

    job: str
    host: str
    state: str
    pids: tuple[int, ...] = ()
    gpus: tuple[int, ...] = ()
    device: str = "cuda"
    since: str = ""
    restarts: int = 0
    crash_restarts: int = 0
    last_exit: int | None = None
    fallback_reason: str | None = None
    message: str = ""
    start_times: tuple[float, ...] = ()
    assignment_revision: int = 0

    def to_json(self) -> bytes:
        """Encode for the store."""
        return _encode(
            {
                "job": self.job,
                "host": self.host,
                "state": self.state,
                "pids": list(self.pids),
                "gpus": list(self.gpus),
                "device": self.device,
                "since": self.since,
                "restarts": self.restarts,
                "crash_restarts": self.crash_restarts,
                "last_exit": self.last_exit,
                "fallback_reason": self.fallback_reason,
                "message": self.message,
                "start_times": list(self.start_times),
                "assignment_revision": self.assignment_revision,
            }
        )

    @classmethod
    def from_json(cls, raw: bytes) -> WorkerRecord:
        """Decode a stored worker record."""
        d = decode(raw, "worker record")
        return cls(
            job=d["job"],
            host=d["host"],
            state=d["state"],
            pids=tuple(int(p) for p in d.get("pids", ())),
            gpus=tuple(int(g) for g in d.get("gpus", ())),
            device=d.get("device", "cuda"),
            since=d.get("since", ""),
            restarts=int(d.get("restarts", 0)),
            crash_restarts=int(d.get("crash_restarts", 0)),
            last_exit=d.get("last_exit"),
            fallback_reason=d.get("fallback_reason"),
            message=d.get("message", ""),
            start_times=tuple(float(t) for t in d.get("start_times", ())),
            assignment_revision=int(d.get("assignment_revision", 0)),
        )
