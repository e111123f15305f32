"""``allocator cancel`` in-process: what it ends, whose, and what a waiter then does."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import pytest

from allocator.cli import main
from allocator.control.holder import holder_name
from allocator.records.holders import QueueEntry
from allocator.records.keys import KeyLayout
from allocator.store import Put, open_store
from tests.support.waiting import wait_for

POLICY = "version: 1\nhosts:\n  node1: {gpus: 1}\n"


def _store(tmp_path: Path, policy: str = POLICY) -> str:
    url = f"memory://cancel-{uuid.uuid4().hex}"
    path = tmp_path / "policy.yaml"
    path.write_text(policy)
    assert main(["policy", "apply", str(path), "--store", url]) == 0
    return url


def _wait_as(url: str, job: str, holder: str) -> str:
    """A queue entry of ``holder``'s (as its waiter would write it); its key."""
    store, layout = open_store(url), KeyLayout()
    entry = QueueEntry(job=job, host="node1", holder=holder, since="t", count=1)
    key = layout.queue_entry("node1", job)
    store.txn([], [Put(key, entry.to_json(), lease=store.grant_lease(30))])
    return key


def _queued(url: str) -> list[str]:
    return [i.key for i in open_store(url).list(KeyLayout().queue).items]


@pytest.mark.parametrize(
    "words", [[], ["job=a", "--me"], ["--me", "user=bob"], ["job=a/b"], ["job=a", "gpu=1"]]
)
def test_bad_input_is_exit_2(tmp_path: Path, words: list[str]) -> None:
    assert main(["cancel", *words, "--store", _store(tmp_path)]) == 2


def test_nothing_to_cancel_is_exit_6(tmp_path: Path) -> None:
    url = _store(tmp_path)
    assert main(["cancel", "job=absent", "--store", url]) == 6
    assert main(["cancel", "--me", "--store", url]) == 6


def test_another_users_request_is_refused_and_stays(tmp_path: Path) -> None:
    url = _store(tmp_path)
    key = _wait_as(url, "sweep", "someone-else")
    assert main(["cancel", "job=sweep", "--store", url]) == 5
    assert _queued(url) == [key]


def test_an_operator_cancels_anyones_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    me = holder_name(None)
    url = _store(tmp_path, POLICY + f"operators: ['user:{me}']\n")
    _wait_as(url, "sweep", "someone-else")
    capsys.readouterr()
    assert main(["cancel", "job=sweep", "-o", "json", "--store", url]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"cancelled": [{"job": "sweep", "host": "node1", "state": "pending"}]}
    assert _queued(url) == []


def test_a_waiting_set_stops_with_exit_3_and_release_points_at_cancel(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _store(tmp_path)
    assert main(["set", "job=first", "count=1", "host=node1", "--store", url]) == 0
    codes: list[int] = []
    words = ["set", "job=sweep", "count=1", "host=node1", "--wait", "--store", url]
    waiter = threading.Thread(target=lambda: codes.append(main(words)))
    waiter.start()
    try:
        wait_for("the waiter's entry", lambda: _queued(url), timeout=10)
        capsys.readouterr()
        assert main(["release", "job=sweep", "--store", url]) == 6
        assert "`allocator cancel job=sweep`" in capsys.readouterr().err
        assert main(["cancel", "job=sweep", "--store", url]) == 0
        assert capsys.readouterr().out.strip() == "cancelled waiting request sweep on node1"
        waiter.join(timeout=15)
    finally:
        if waiter.is_alive():
            main(["release", "job=first", "--store", url])
            waiter.join(timeout=15)
    assert codes == [3]  # it stopped: it did not join again, nor take the GPUs
    assert _queued(url) == []
    assert "cancelled by" in capsys.readouterr().err


def test_a_running_job_is_released_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _store(tmp_path)
    assert main(["set", "job=train", "count=1", "host=node1", "--store", url]) == 0
    capsys.readouterr()
    assert main(["cancel", "--me", "--store", url]) == 0
    line = capsys.readouterr().out.strip()
    assert line == (
        "cancelled running job train on node1: its workers get SIGTERM, then SIGKILL after 10s"
    )
    assert main(["get", "job=train", "--store", url]) == 6
    assert main(["history", "job=train", "-o", "json", "--store", url]) == 0
    entries = json.loads(capsys.readouterr().out)["entries"]
    assert entries[0]["reason"] == f"cancelled by {holder_name(None)}"
