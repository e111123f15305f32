"""Agent settings: defaults, file, flag overrides, and one-line refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocator.agent.config import load_agent_config
from allocator.errors import InvalidInput


def test_defaults_need_no_file() -> None:
    config = load_agent_config(None, {"host": "node1"})
    assert config.host == "node1"
    assert config.prefix == "/allocator"
    assert config.heartbeat_seconds < config.lease_ttl
    assert config.worker_log_dir == config.agent_dir / "logs"


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("host: a\nlog-format: json\nlease_ttl: 40\nstate_dir: /var/lib/x\n")
    config = load_agent_config(str(path), {"host": "b", "log_format": None})
    assert config.host == "b"
    assert config.log_format == "json"
    assert config.lease_ttl == 40.0
    assert config.agent_dir == Path("/var/lib/x")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lease_tll: 3\n", "did you mean 'lease_ttl'"),
        ("lease_ttl: -1\n", "positive number"),
        ("heartbeat_seconds: 40\n", "shorter than lease_ttl"),
        ("log_format: xml\n", "text or json"),
        ("keep_workers_on_exit: maybe\n", "true or false"),
        ("- a\n- b\n", "mapping"),
        ("host: ../x\n", "may contain only"),
        ("prefix: nope\n", "prefix"),
        ("a: [\n", "cannot read"),
    ],
)
def test_bad_settings_are_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    with pytest.raises(InvalidInput) as info:
        load_agent_config(str(path), {})
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="not found"):
        load_agent_config(str(tmp_path / "nope.yaml"), {})


def test_the_metrics_port_is_a_port_number() -> None:
    from allocator.agent.config import load_agent_config as load
    from allocator.errors import InvalidInput

    assert load(None, {"host": "n1", "metrics_port": 9400}).metrics_port == 9400
    for bad in (0, 70000, "9400", True):
        try:
            load(None, {"host": "n1", "metrics_port": bad})
        except InvalidInput as exc:
            assert "metrics_port must be a port number" in str(exc)
        else:
            raise AssertionError(f"metrics_port {bad!r} was accepted")
