"""The policy commands on a real (in-memory) store: size agreement, reservation reports."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from allocator.cli import main
from allocator.policy import MAX_POLICY_BYTES
from allocator.store import open_store

BASE = (
    "version: 1\nhosts:\n  node1: {gpus: 4}\n"
    "jobs:\n  train: {command: [x], fallback: cpu}\n  eval-nightly: {command: [y]}\n"
)
RULES = "fallback:\n  cpu: {action: cpu}\n"
LATER = (
    "reservations:\n"
    "  - {name: eval, host: node1, gpus: [3], for: [eval-*], start: 2099-01-01T00:00:00Z}\n"
)
NOW_ON = (
    "reservations:\n"
    "  - {name: eval, host: node1, gpus: [3], for: [eval-*], until: 2099-01-01T00:00:00Z}\n"
)


@pytest.fixture
def url() -> str:
    return f"memory://cli-policy-{uuid.uuid4().hex}"


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def dump(url: str) -> list[tuple[str, bytes, int]]:
    store = open_store(url)
    try:
        listing = store.list("/")
        return [(kv.key, kv.value, kv.mod_revision) for kv in listing.items]
    finally:
        store.close()


def test_validate_and_apply_agree_on_a_policy_too_large_to_store(
    tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = MAX_POLICY_BYTES // 100 + 10
    path = write(tmp_path, "big.yaml", "version: 1\n" + ("#" * 99 + "\n") * lines)
    assert main(["policy", "validate", path]) == 2
    refused = capsys.readouterr().err.splitlines()
    assert len(refused) == 1 and refused[0].startswith(f"allocator: error: {path}:")
    assert "too large" in refused[0]
    before = dump(url)
    assert main(["policy", "apply", path, "--store", url]) == 2
    assert capsys.readouterr().err.splitlines() == refused
    assert dump(url) == before


def test_set_warns_when_a_reservation_will_take_the_gpu(
    tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["policy", "apply", write(tmp_path, "p.yaml", BASE + RULES + LATER), "--store", url])
        == 0
    )
    capsys.readouterr()
    assert main(["set", "job=train", "gpus=3", "--store", url]) == 0
    captured = capsys.readouterr()
    assert "train@node1: gpus 3" in captured.out
    assert captured.err == (
        "allocator: note: GPU 3 on node1 is reserved by 'eval' for eval-* with no end from "
        "2099-01-01T00:00:00Z; job 'train' loses it then (its fallback rule applies)\n"
    )


def test_diff_and_apply_report_a_held_gpu_a_new_reservation_will_take(
    tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["policy", "apply", write(tmp_path, "a.yaml", BASE + RULES), "--store", url]) == 0
    assert main(["set", "job=train", "gpus=3", "--store", url]) == 0
    later = write(tmp_path, "b.yaml", BASE + RULES + LATER)
    capsys.readouterr()
    assert main(["policy", "diff", later, "-o", "json", "--store", url]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["conflicts"] == []
    assert data["upcoming_conflicts"] == [
        "train@node1: GPU 3 is reserved by 'eval' for eval-* with no end from 2099-01-01T00:00:00Z"
    ]
    assert main(["policy", "apply", later, "--store", url]) == 0
    assert capsys.readouterr().err == (
        "allocator: warning: will conflict when its reservation window opens: "
        "train@node1: GPU 3 is reserved by 'eval' for eval-* with no end from "
        "2099-01-01T00:00:00Z\n"
    )


def test_reapplying_the_applied_file_still_reports_what_breaks_it_now(
    tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["policy", "apply", write(tmp_path, "a.yaml", BASE + RULES), "--store", url]) == 0
    assert main(["set", "job=train", "gpus=3", "--store", url]) == 0
    reserved = write(tmp_path, "b.yaml", BASE + RULES + NOW_ON)
    assert main(["policy", "apply", reserved, "--store", url]) == 3  # the refusal stands
    assert main(["policy", "apply", reserved, "--force", "--store", url]) == 0
    capsys.readouterr()
    before = dump(url)
    assert main(["policy", "apply", reserved, "--store", url]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("unchanged ")
    assert captured.err == (
        "allocator: warning: the applied policy is broken by a current assignment: "
        "train@node1: GPU 3 on node1 is reserved by 'eval' for eval-* until "
        "2099-01-01T00:00:00Z\n"
    )
    assert dump(url) == before


def test_diff_names_the_hosts_a_range_edit_changes(
    tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ranged = "version: 1\nhosts:\n  node[000-199]: {gpus: 8}\n"
    assert main(["policy", "apply", write(tmp_path, "a.yaml", ranged), "--store", url]) == 0
    exception = ranged + "  node042: {gpus: 4}\n"
    capsys.readouterr()
    assert main(["policy", "diff", write(tmp_path, "b.yaml", exception), "--store", url]) == 0
    assert "hosts changed: node042\n" in capsys.readouterr().out
    wider = ranged.replace("199", "249")
    assert (
        main(["policy", "diff", write(tmp_path, "c.yaml", wider), "-o", "json", "--store", url])
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["hosts_changed"] == [f"node{n}" for n in range(200, 250)]
