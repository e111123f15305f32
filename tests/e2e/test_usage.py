"""``allocator usage`` on a real store: holdings whose start history trimmed still count."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.e2e.conftest import EXAMPLE_POLICY, Cli


def test_a_holding_whose_set_history_dropped_still_counts(cli: Cli, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(EXAMPLE_POLICY.read_text() + "history: {entries_per_host: 2}\n")
    assert cli("policy", "apply", str(policy)).code == 0
    assert cli("set", "job=long", "gpus=0,1", "host=node1").code == 0
    for n in range(2):  # two more changes on node1: long's set entry is dropped
        assert cli("set", f"job=short{n}", "gpus=2", "host=node1").code == 0
        assert cli("release", f"job=short{n}", "host=node1").code == 0
    history = json.loads(cli("history", "host=node1", "-o", "json").out)["entries"]
    assert "long" not in {entry["job"] for entry in history}
    result = cli("usage", "--by", "job", "-o", "json")
    assert result.code == 0, result.err
    rows = {row["key"]: row for row in json.loads(result.out)["rows"]}
    # Still held: counted from its assignment's own time, as many GPUs as it holds.
    assert "long" in rows and rows["long"]["jobs"] == ["long"]


def test_the_rollup_counts_what_history_counted_once_rebuilt(cli: Cli) -> None:
    assert cli("policy", "apply", str(EXAMPLE_POLICY)).code == 0
    assert cli("set", "job=old", "gpus=0,1", "host=node1").code == 0
    assert cli("release", "job=old", "host=node1").code == 0
    assert cli("set", "job=kept", "gpus=2", "host=node1").code == 0
    before = json.loads(cli("usage", "--by", "job", "-o", "json").out)
    assert before["source"] == "history"
    rebuilt = cli("usage", "--by", "job", "--rebuild", "-o", "json")
    assert rebuilt.code == 0, rebuilt.err
    after = json.loads(rebuilt.out)
    assert after["source"] == "rollup"
    # The rebuild counts what history counted (a holding within one second counts 0 in both).
    assert _hours(after) == _hours(before)
    assert cli("release", "job=kept", "host=node1").code == 0
    again = json.loads(cli("usage", "--by", "job", "-o", "json").out)
    assert again["source"] == "rollup"
    # The row the release wrote and the rebuilt one are one holding each: nothing twice.
    assert all(row["holdings"] == 1 for row in again["rows"])
    assert set(_hours(again)) <= {"old", "kept"}


def _hours(document: dict[str, Any]) -> dict[str, float]:
    return {row["key"]: row["gpu_hours"] for row in document["rows"] if row["key"] != "kept"}


def test_a_job_across_hosts_is_counted_on_each_host_once(cli: Cli) -> None:
    assert cli("policy", "apply", str(EXAMPLE_POLICY)).code == 0
    assert cli("usage", "--rebuild", "-o", "json").code == 0  # an empty history: the marker
    assert cli("set", "job=ring", "host=node1,node2", "gpus=0-1").code == 0
    assert cli("release", "job=ring").code == 0
    document = json.loads(cli("usage", "--by", "host", "-o", "json").out)
    assert document["source"] == "rollup"
    # One row per host the release ended (a holding within one second counts none).
    assert all(row["holdings"] == 1 and row["jobs"] == ["ring"] for row in document["rows"])
    assert {row["key"] for row in document["rows"]} <= {"node1", "node2"}
