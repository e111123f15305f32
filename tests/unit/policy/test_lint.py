"""Warnings: policies that load but hold a likely mistake; ``validate`` exits 0 unless --strict."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from allocator.cli import main
from allocator.policy import lint_policy

NOW = datetime(2027, 6, 1, tzinfo=UTC)
EXAMPLE = Path(__file__).resolve().parents[3] / "config" / "policy.example.yaml"

MISTAKES = """\
version: 1
hosts:
  node1.example.com: {gpus: 4}
  node2: {gpus: 4}
  NODE2: {gpus: 4}
jobs:
  train: {command: [x]}
  Train: {command: [y]}
  eval-a: {command: [z]}
reservations:
  - {name: old, host: node2, gpus: [0], for: [eval-*], until: 2027-01-01T00:00:00Z}
  - {name: all, host: node2, gpus: [1], for: ["*"]}
  - {name: typo, host: node2, gpus: [2], for: [evl-*]}
"""


def warnings_of(text: str) -> list[tuple[int | None, str | None, str]]:
    _, warnings = lint_policy(text, "p.yaml", NOW)
    return [(w.line, w.field, w.reason) for w in warnings]


def test_each_likely_mistake_is_a_warning_with_its_line() -> None:
    assert warnings_of(MISTAKES) == [
        (
            3,
            "hosts.node1.example.com",
            "host 'node1.example.com' has a dot, but the agent and `allocator set` default to "
            "the short host name ('node1'): name it 'node1', or always give host= and set "
            "host: in the agent's config",
        ),
        (
            5,
            "hosts.NODE2",
            "host 'NODE2' differs from 'node2' only in case; host names ignore case (DNS), "
            "so they name one machine",
        ),
        (
            8,
            "jobs.Train",
            "job 'Train' differs from 'train' only in case; people, and file systems that "
            "ignore case (for log files), take them for one",
        ),
        (
            11,
            "reservations[0].until",
            "reservation 'old' ended at 2027-01-01T00:00:00Z; it reserves nothing any more "
            "(remove it)",
        ),
        (
            12,
            "reservations[1].for[0]",
            "glob '*' matches every job, so reservation 'all' keeps its GPUs from no one",
        ),
        (
            13,
            "reservations[2].for[0]",
            "glob 'evl-*' matches no job declared under jobs (Train, eval-a, train)",
        ),
    ]


def test_the_example_policy_has_no_warnings() -> None:
    assert warnings_of(EXAMPLE.read_text()) == []


def test_validate_prints_warnings_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(MISTAKES.replace("2027-01-01", "2020-01-01"))
    assert main(["policy", "validate", str(path)]) == 0
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 6
    assert all(line.startswith(f"allocator: warning: {path}:") for line in lines)
    assert lines[0] == (
        f"allocator: warning: {path}:3: hosts.node1.example.com: host 'node1.example.com' has "
        "a dot, but the agent and `allocator set` default to the short host name ('node1'): "
        "name it 'node1', or always give host= and set host: in the agent's config"
    )
    assert captured.out.strip().endswith("3 jobs; 6 warning(s))")


def test_validate_strict_refuses_warnings_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nhosts:\n  n1.lab: {gpus: 1}\n")
    assert main(["policy", "validate", "--strict", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith(f"allocator: error: {path}:3: hosts.n1.lab: host 'n1.lab' has a dot")
    assert line.endswith("(a warning, refused by --strict)")


def test_validate_json_lists_the_warnings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nhosts:\n  n1.lab: {gpus: 1}\n")
    assert main(["policy", "validate", str(path), "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["valid"] is True and data["errors"] == []
    (warning,) = data["warnings"]
    assert (warning["line"], warning["field"]) == (3, "hosts.n1.lab")
    assert main(["policy", "validate", "--strict", str(path), "-o", "json"]) == 2
    assert json.loads(capsys.readouterr().out)["valid"] is False


def test_a_history_cap_past_half_of_etcds_default_quota_is_a_warning() -> None:
    base = "version: 1\nhosts:\n  node1: {gpus: 8}\n"
    (found,) = warnings_of(base + "history: {max_bytes: 1536MiB}\n")
    assert found[:2] == (4, "history.max_bytes")
    assert "1.5 GiB of history" in found[2] and "--quota-backend-bytes" in found[2]
    assert warnings_of(base + "history: {max_bytes: 1GiB}\n") == []
