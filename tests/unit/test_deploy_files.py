"""The files operators deploy from: compose file, systemd unit, agent settings."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

from allocator.agent.config import load_agent_config

REPO = Path(__file__).resolve().parents[2]


def _compose_command() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
        if probe.returncode == 0:
            return ["docker", "compose"]
    return None


def test_compose_file_parses() -> None:
    command = _compose_command()
    if command is None:
        pytest.skip("neither docker-compose nor `docker compose` is installed")
    result = subprocess.run(
        [*command, "-f", str(REPO / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_compose_wires_the_agent_to_a_store() -> None:
    import yaml

    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"etcd", "consul", "agent"} <= set(services)
    assert services["agent"]["environment"]["ALLOCATOR_STORE"].startswith("etcd://etcd:")
    assert all("healthcheck" in services[name] for name in ("etcd", "consul", "agent"))
    # The agent uses etcd: it waits for etcd alone, and Consul starts only when asked for.
    assert set(services["agent"]["depends_on"]) == {"etcd"}
    assert services["consul"]["profiles"] == ["consul"]


def test_the_image_carries_the_status_page() -> None:
    install = [
        line for line in (REPO / "Dockerfile").read_text().splitlines() if "pip install" in line
    ]
    assert len(install) == 1 and "serve" in install[0] and "nvml" in install[0]


def test_systemd_unit_runs_the_agent_and_reloads_with_sighup() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(REPO / "config" / "allocator-agent.service")
    service = unit["Service"]
    assert "allocator agent" in service["ExecStart"]
    assert "-HUP" in service["ExecReload"]


def test_systemd_unit_leaves_workers_to_be_adopted_when_the_agent_dies() -> None:
    """Only the agent is signalled: its workers outlive it, in cgroups it may create."""
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(REPO / "config" / "allocator-agent.service")
    service = unit["Service"]
    assert service["KillMode"] == "process"  # mixed/control-group would kill every worker
    assert service["Delegate"] == "yes"
    assert service["Restart"] == "always"


def test_systemd_unit_lets_the_agent_leave_no_core_dump_with_store_secrets() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(REPO / "config" / "allocator-agent.service")
    assert unit["Service"]["LimitCORE"] == "0"


def test_systemd_unit_passes_systemds_own_check(tmp_path: Path) -> None:
    verify = shutil.which("systemd-analyze")
    assert verify is not None, "systemd-analyze is missing: run tools/install-test-servers"
    text = (REPO / "config" / "allocator-agent.service").read_text()
    unit = tmp_path / "allocator-agent.service"
    unit.write_text(text.replace("/opt/allocator/bin/allocator", "/bin/true"))  # not installed
    result = subprocess.run(
        [verify, "verify", str(unit)], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_systemd_unit_notices_a_hung_agent() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(REPO / "config" / "allocator-agent.service")
    service = unit["Service"]
    assert service["Type"] == "notify"  # ready once it has adopted its workers
    assert service["NotifyAccess"] == "main"  # a worker cannot ping for it
    assert int(service["WatchdogSec"]) > 0
    assert service["Restart"] == "always"


def test_example_agent_settings_load() -> None:
    config = load_agent_config(str(REPO / "config" / "agent.example.yaml"), {})
    assert config.host == "node1"
    assert config.heartbeat_seconds < config.lease_ttl


def test_compose_etcd_compacts_its_history_and_has_a_quota() -> None:
    import yaml

    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    command = compose["services"]["etcd"]["command"]
    assert "--auto-compaction-mode=periodic" in command
    assert any(arg.startswith("--auto-compaction-retention=") for arg in command)
    assert any(arg.startswith("--quota-backend-bytes=") for arg in command)
