"""Input errors are exit 2 with one line; the audit name comes from the OS; stored text escaped."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from allocator.cli import main
from allocator.control.actor import actor, store_user
from allocator.records.keys import KeyLayout
from allocator.records.types import Assignment, PolicyRecord
from allocator.store import open_store
from allocator.util.identity import local_hostname

EXAMPLE = Path(__file__).resolve().parents[3] / "config" / "policy.example.yaml"
HUGE = "9" * 5000


@pytest.fixture
def url() -> Iterator[str]:
    """A memory store with the example policy applied."""
    name = f"memory://cli-input-{uuid.uuid4().hex}"
    assert main(["policy", "apply", str(EXAMPLE), "--store", name]) == 0
    yield name


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert "internal error" not in lines[0] and "Traceback" not in captured.err
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["set", "job=train", f"count={HUGE}"], "count= is 5,000 characters long; at most 8"),
        (["set", "job=train", f"gpus={HUGE}"], "GPU index 999999999999999999999999999999999999"),
        (["set", "job=train", f"gpus=0-{HUGE}"], "is out of range (0-1023)"),
        (["env", "job=train", f"worker={HUGE}"], "worker= is 5,000 characters long; at most 8"),
        (["get", f"job={'x' * 100_000}"], "job= is 100,000 characters long; at most 1,024"),
        (
            ["set", f"{'k' * 100_000}=1"],
            "unknown argument 'kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk...'",
        ),
    ],
)
def test_overlong_words_are_exit_2_with_one_short_line(
    url: str, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    capsys.readouterr()
    assert main([*argv, "--store", url]) == 2
    line = one_error_line(capsys)
    assert line.startswith("allocator: error: ") and message in line, line
    assert len(line) < 300


def test_the_audit_name_comes_from_the_os_not_from_logname(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.setenv(variable, "x\nevil\x1b[2J")
    assert main(["set", "job=train", "gpus=0", "host=node1", "--store", url]) == 0
    capsys.readouterr()
    assert main(["get", "job=train", "-o", "json", "--store", url]) == 0
    record = json.loads(capsys.readouterr().out)
    me = pwd.getpwuid(os.getuid()).pw_name
    assert record["updated_by"] == f"{me}@{local_hostname()}"
    assert actor() == record["updated_by"]


def test_the_stores_authenticated_user_is_recorded_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ETCDCTL_USER", raising=False)
    assert store_user("etcd://ops:secret@127.0.0.1:2379") == "ops"
    assert actor("etcd://ops:secret@127.0.0.1:2379").endswith(" (etcd user ops)")
    monkeypatch.setenv("ETCDCTL_USER", "ci:pw")
    assert store_user("etcd://127.0.0.1:2379") == "ci"
    assert store_user("sqlite:///tmp/x.db") is None and store_user(None) is None


def _write(url: str, key: str, value: bytes) -> None:
    store = open_store(url)
    try:
        store.put(key, value)
    finally:
        store.close()


def test_stored_control_characters_print_escaped_in_tables_and_get(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = KeyLayout()
    forged = Assignment(
        job="train",
        host="node1",
        gpus=(0,),
        mode="gpu",
        updated_by="mallory\x1b]0;pwned\x07",
        updated_at="2026-01-01T00:00:00Z",
        reason="fine\nnode1  1  intruder",
    )
    _write(url, layout.assignment("node1", "train"), forged.to_json())
    capsys.readouterr()
    assert main(["status", "--store", url]) == 0
    table = capsys.readouterr().out
    assert "\x1b" not in table and "\x07" not in table
    assert "fine\\nnode1  1  intruder" in table  # the forged row stays inside its cell
    assert main(["get", "job=train", "--store", url]) == 0
    shown = capsys.readouterr().out
    assert "\x1b" not in shown and "mallory\\x1b]0;pwned\\x07" in shown


def test_policy_show_escapes_a_forged_audit_name(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = EXAMPLE.read_text()
    record = PolicyRecord(
        yaml=text,
        sha256=hashlib.sha256(text.encode()).hexdigest(),
        applied_by="eve\nversion: 2\x1b[31m",
        applied_at="2026-01-01T00:00:00Z",
        source="x.yaml",
    )
    _write(url, KeyLayout().policy, record.to_json())
    capsys.readouterr()
    assert main(["policy", "show", "--store", url]) == 0
    out = capsys.readouterr().out
    header, rest = out.split("\n", 1)
    assert header.startswith("# applied 2026-01-01T00:00:00Z by eve\\nversion: 2\\x1b[31m")
    assert rest == text
