"""The agent's local copy of the assignments it last read intact."""

from __future__ import annotations

import json
from pathlib import Path

from allocator.agent.sync.last_good import load_last_good, save_last_good
from allocator.records.types import Assignment

TRAIN = Assignment("train", "node1", (0, 2), "gpu", "ops@x", "2026-01-01T00:00:00Z")


def test_saved_assignments_load_back_with_their_revisions(tmp_path: Path) -> None:
    path = tmp_path / "assignments.json"
    save_last_good(path, {"train": TRAIN}, {"train": 7})
    assert load_last_good(path, "node1") == ({"train": TRAIN}, {"train": 7})


def test_a_missing_or_damaged_file_is_simply_not_used(tmp_path: Path) -> None:
    path = tmp_path / "assignments.json"
    assert load_last_good(path, "node1") == ({}, {})
    path.write_text("{not json")
    assert load_last_good(path, "node1") == ({}, {})
    save_last_good(path, {"train": TRAIN}, {"train": 7})
    data = json.loads(path.read_text())
    data["jobs"]["train"]["assignment"]["gpus"] = "0,2"
    path.write_text(json.dumps(data))
    assert load_last_good(path, "node1") == ({}, {})


def test_another_hosts_or_another_jobs_entry_is_not_used(tmp_path: Path) -> None:
    path = tmp_path / "assignments.json"
    save_last_good(path, {"ghost": TRAIN}, {"ghost": 3})  # body says train
    assert load_last_good(path, "node1") == ({}, {})
    save_last_good(path, {"train": TRAIN}, {"train": 3})
    assert load_last_good(path, "node2") == ({}, {})
