"""``allocator queue`` in-process: the fair-share columns appear only with fair share."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from allocator.cli import main
from allocator.records.holders import QueueEntry
from allocator.records.keys import KeyLayout
from allocator.store import Put, open_store

POLICY = "version: 1\nhosts:\n  node1: {gpus: 1}\n"


def _store(tmp_path: Path, policy: str) -> str:
    url = f"memory://queue-{uuid.uuid4().hex}"
    path = tmp_path / "policy.yaml"
    path.write_text(policy)
    assert main(["policy", "apply", str(path), "--store", url]) == 0
    return url


def _wait(url: str, job: str, share: float | None = None, usage: float | None = None) -> None:
    store, layout = open_store(url), KeyLayout()
    entry = QueueEntry(
        job=job,
        host="node1",
        holder=job,
        since="t",
        count=1,
        requested="count=1",
        fair_share=share,
        usage=usage,
    )
    lease = store.grant_lease(30)
    store.txn([], [Put(layout.queue_entry("node1", job), entry.to_json(), lease=lease)])


def _queue(url: str, capsys: pytest.CaptureFixture[str], *words: str) -> str:
    capsys.readouterr()
    assert main(["queue", *words, "--store", url]) == 0
    return capsys.readouterr().out


def test_with_fair_share_the_table_and_json_show_the_factor_and_usage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _store(tmp_path, POLICY + "fair_share: {half_life: 7d}\n")
    _wait(url, "heavy", share=0.25, usage=200.0)
    _wait(url, "light", share=1.0, usage=0.0)
    table = _queue(url, capsys).splitlines()
    assert table[0].split()[6:9] == ["PRIO", "FAIRSHARE", "USAGE"]
    assert [line.split()[2:3] + line.split()[7:9] for line in table[1:]] == [
        ["light", "1.000", "0.0"],
        ["heavy", "0.250", "200.0"],
    ]
    listed = json.loads(_queue(url, capsys, "-o", "json"))["queue"]
    assert [(q["holder"], q["fair_share"], q["usage"]) for q in listed] == [
        ("light", 1.0, 0.0),
        ("heavy", 0.25, 200.0),
    ]


def test_without_fair_share_the_queue_looks_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _store(tmp_path, POLICY)
    _wait(url, "first")
    assert _queue(url, capsys).split()[:8] == [
        "POS", "HOST", "WHO", "JOB", "WHAT", "SINCE", "PRIO", "WHY"
    ]  # fmt: skip
    (listed,) = json.loads(_queue(url, capsys, "-o", "json"))["queue"]
    assert "fair_share" not in listed and "usage" not in listed
