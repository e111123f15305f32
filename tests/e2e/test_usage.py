"""``allocator usage`` on a real store: holdings whose start history trimmed still count."""

from __future__ import annotations

import json
from pathlib import Path

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
