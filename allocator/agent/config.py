"""The agent's own settings: a small YAML file, overridden by command-line flags.

Everything has a default, so ``allocator agent`` runs with no file at all.
SIGHUP re-reads the file (the store URL and host cannot change without a
restart; everything else can).
"""

from __future__ import annotations

import difflib
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from allocator.errors import InvalidInput
from allocator.records.keys import DEFAULT_PREFIX, validate_name, validate_prefix
from allocator.util.identity import local_hostname

__all__ = ["AgentConfig", "default_state_dir", "load_agent_config"]

# What another host can connect to: a host name or an IP address, nothing else.
_ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:%-]{0,252}\Z")


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/allocator`` or ``~/.local/state/allocator``."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "allocator"


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Settings of one host agent."""

    host: str
    store: str | None = None
    prefix: str = DEFAULT_PREFIX
    state_dir: Path | None = None
    log_dir: Path | None = None
    lease_ttl: float = 30.0
    heartbeat_seconds: float = 10.0
    resync_seconds: float = 30.0
    # A store back from a short outage is found again within this (plus the
    # connect): the reliability suite holds the agent to converging within 5 s.
    retry_max_seconds: float = 4.0
    keep_workers_on_exit: bool = False
    log_format: str = "text"
    # MASTER_ADDR of this host's per-gpu jobs (127.0.0.1 when unset), and the
    # address it advertises for jobs across hosts whose rank 0 runs here
    # (this machine's host name when unset).
    master_addr: str | None = None
    # Prometheus /metrics: off unless a port is given; all interfaces by default,
    # like node_exporter, so the fleet's Prometheus can scrape it.
    metrics_port: int | None = None
    metrics_address: str = "0.0.0.0"
    # The host's mean GPU utilisation in its counts record (what serve plots) changes
    # at most this often; 0 reports none.
    utilisation_report_seconds: float = 300.0

    @property
    def local_master_addr(self) -> str:
        """MASTER_ADDR of a per-gpu job on this host alone."""
        return self.master_addr or "127.0.0.1"

    @property
    def advertised_address(self) -> str:
        """Where other hosts reach this one: ``master_addr``, else the host name."""
        return self.master_addr or socket.gethostname()

    @property
    def agent_dir(self) -> Path:
        """Where this host's agent keeps its state file (adoption after restarts)."""
        return self.state_dir or (default_state_dir() / f"agent-{self.host}")

    @property
    def worker_log_dir(self) -> Path:
        """Where each job's stdout/stderr go: ``<log_dir>/<job>.log``."""
        return self.log_dir or (self.agent_dir / "logs")


_FLOAT_FIELDS = {"lease_ttl", "heartbeat_seconds", "resync_seconds", "retry_max_seconds"}
_PATH_FIELDS = {"state_dir", "log_dir"}


def load_agent_config(path: str | None, overrides: Mapping[str, Any]) -> AgentConfig:
    """Read ``path`` (if given), then apply non-``None`` ``overrides``; validate."""
    values: dict[str, Any] = dict(_read_file(path)) if path else {}
    values.update({k: v for k, v in overrides.items() if v is not None})
    host = validate_name(str(values.pop("host", None) or local_hostname()), "host")
    config = AgentConfig(host=host)
    known = {f.name for f in fields(AgentConfig)} - {"host"}
    for key, value in values.items():
        if key not in known:
            hint = difflib.get_close_matches(key, sorted(known), n=1)
            where = f"{path}: " if path else ""
            raise InvalidInput(
                f"{where}unknown agent setting {key!r}"
                + (f"; did you mean {hint[0]!r}?" if hint else "")
            )
        config = replace(config, **{key: _coerce(key, value, path)})
    return _validated(config)


def _read_file(path: str) -> Mapping[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInput(f"{path}: agent config file not found") from None
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidInput(
            f"{path}: cannot read agent config: {' '.join(str(exc).split())}"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InvalidInput(f"{path}: agent config must be a mapping of settings")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def _coerce(key: str, value: Any, path: str | None) -> Any:
    where = f"{path}: " if path else ""
    if key in _FLOAT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise InvalidInput(f"{where}{key} must be a positive number, got {value!r}")
        return float(value)
    if key == "utilisation_report_seconds":
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise InvalidInput(f"{where}{key} must be a number of seconds (0: off), got {value!r}")
        return float(value)
    if key in _PATH_FIELDS:
        return Path(str(value))
    if key == "metrics_port":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
            raise InvalidInput(f"{where}{key} must be a port number 1-65535, got {value!r}")
        return value
    if key == "keep_workers_on_exit":
        if not isinstance(value, bool):
            raise InvalidInput(f"{where}{key} must be true or false, got {value!r}")
        return value
    if key == "log_format" and value not in ("text", "json"):
        raise InvalidInput(f"{where}log_format must be text or json, got {value!r}")
    if key == "master_addr" and not _ADDRESS.match(str(value)):
        raise InvalidInput(
            f"{where}master_addr must be a host name or an IP address, got {str(value)[:80]!r}"
        )
    return str(value)


def _validated(config: AgentConfig) -> AgentConfig:
    config = replace(config, prefix=validate_prefix(config.prefix))
    if config.heartbeat_seconds >= config.lease_ttl:
        raise InvalidInput(
            f"heartbeat_seconds ({config.heartbeat_seconds}) must be shorter than lease_ttl "
            f"({config.lease_ttl}), or the agent's liveness key expires between heartbeats"
        )
    return config
