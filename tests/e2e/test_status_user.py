"""``status user=``/``--me``, the USER column, and ``queue user=``/``--me``, on each store."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from allocator.control.client import Allocator
from allocator.control.holder import holder_name
from allocator.placement.choose import Request
from allocator.store import Store
from tests.e2e.conftest import Cli

POLICY = """\
version: 1
hosts:
  node1: {gpus: 2}
  node2: {gpus: 2}
"""


def _fleet(cli: Cli, store: Store, prefix: str, tmp_path: Path) -> str:
    """node1 GPU 0 held by this user (the CLI), node2 GPU 1 by bob; who "me" is."""
    (tmp_path / "policy.yaml").write_text(POLICY)
    assert cli("policy", "apply", str(tmp_path / "policy.yaml")).code == 0
    result = cli("set", "job=mine", "gpus=0", "host=node1")
    assert result.code == 0, result.err
    bob = Allocator(store, prefix=prefix, holder="bob")
    bob.assign(Request(job="bobs", host="node2", gpus=(1,)))
    return holder_name(store.url)


def _document(cli: Cli, *words: str) -> dict:  # type: ignore[type-arg]
    result = cli("status", *words, "-o", "json")
    assert result.code == 0, result.err
    return json.loads(result.out)  # type: ignore[no-any-return]


def _held(document: dict) -> list[tuple[str, str, str, str]]:  # type: ignore[type-arg]
    return [
        (h["host"], g["gpu"], g["holder"], g["user"])
        for h in document["hosts"]
        for g in h["gpus"]
        if g["holder"]
    ]


def test_status_picks_by_user_and_me(cli: Cli, store: Store, prefix: str, tmp_path: Path) -> None:
    me = _fleet(cli, store, prefix, tmp_path)
    assert _held(_document(cli)) == [("node1", "0", "mine", me), ("node2", "1", "bobs", "bob")]
    assert _held(_document(cli, "user=bob")) == [("node2", "1", "bobs", "bob")]
    assert _held(_document(cli, "--me")) == [("node1", "0", "mine", me)]
    assert _document(cli, "--me") == _document(cli, f"user={me}")
    (job,) = _document(cli, "user=bob")["hosts"][0]["jobs"]
    assert (job["job"], job["user"]) == ("bobs", "bob")
    assert _document(cli, "user=nobody")["hosts"] == []
    both = cli("status", "user=bob", "--me")
    assert both.code == 2 and "not both" in both.err and both.out == ""


def test_the_table_has_a_job_and_a_user_column(
    cli: Cli, store: Store, prefix: str, tmp_path: Path
) -> None:
    me = _fleet(cli, store, prefix, tmp_path)
    table = cli("status")
    assert table.code == 0, table.err
    lines = table.out.splitlines()
    assert lines[0].split()[:4] == ["HOST", "GPU", "JOB", "USER"]
    assert [line.split()[:4] for line in lines[1:5]] == [
        ["node1", "0", "mine", me],
        ["node1", "1", "-", "-"],
        ["node2", "0", "-", "-"],
        ["node2", "1", "bobs", "bob"],
    ]
    mine = cli("status", "--me")
    assert [line.split()[:4] for line in mine.out.splitlines()[1:2]] == [["node1", "0", "mine", me]]


def test_queue_picks_by_user_and_me(
    cli: Cli, cli_env: dict[str, str], store: Store, prefix: str, tmp_path: Path
) -> None:
    me = _fleet(cli, store, prefix, tmp_path)
    waiter = subprocess.Popen(
        [sys.executable, "-m", "allocator", "set", "job=later", "gpus=0", "host=node1", "--wait"],
        env=cli_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not _queued(cli):
            assert time.monotonic() < deadline, "the waiter never joined the queue"
            time.sleep(0.1)
        assert [q["job"] for q in _queued(cli, "--me")] == ["later"]
        assert [q["holder"] for q in _queued(cli, f"user={me}")] == [me]
        assert _queued(cli, "user=bob") == []
        both = cli("queue", "user=bob", "--me")
        assert both.code == 2 and "not both" in both.err
        statused = _document(cli, "--me")["queue"]
        assert [q["job"] for q in statused] == ["later"]
        assert "queue" not in _document(cli, "user=bob")
    finally:
        waiter.terminate()
        waiter.wait(timeout=30)


def _queued(cli: Cli, *words: str) -> list[dict]:  # type: ignore[type-arg]
    result = cli("queue", *words, "-o", "json")
    assert result.code == 0, result.err
    return json.loads(result.out)["queue"]  # type: ignore[no-any-return]
