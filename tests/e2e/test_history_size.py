"""History sized for the fleet, end to end: real CLI processes on SQLite and a real etcd.

Entries are aged by rewriting their time in the store (what weeks of waiting would do),
then the next append, or ``history prune``, must drop them.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from allocator.control.client import Allocator
from allocator.history.stream import host_stream, policy_stream
from allocator.placement.choose import Request
from allocator.records.codec import decode_record, replace_struct
from allocator.records.keys import KeyLayout
from allocator.records.types import HistoryEntry
from allocator.store import Store
from allocator.util.times import format_time
from tests.e2e.conftest import EXAMPLE_POLICY, Cli, clean_env, history_entries, run_cli, schema

FLEET = "version: 1\nhosts:\n  node[00000-12499]: {gpus: 8}\n"


def _age(store: Store, prefix: str, stream_prefix: str, days: int) -> int:
    """Move every entry under ``stream_prefix`` ``days`` back in time; return how many."""
    back = timedelta(days=days)
    items = store.list(stream_prefix).items
    for item in items:
        entry = decode_record(item.value, HistoryEntry, item.key)
        moment = datetime.fromisoformat(entry.at.replace("Z", "+00:00")) - back
        store.put(item.key, replace_struct(entry, at=format_time(moment)).to_json())
    return len(items)


def test_entries_older_than_max_age_are_gone_after_the_next_append_or_a_prune(
    cli: Cli, store: Store, prefix: str, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(EXAMPLE_POLICY.read_text() + "history: {max_age: 7d}\n")
    assert cli("policy", "apply", str(policy)).code == 0
    for gpu in (0, 1):
        assert cli("set", "job=train", f"gpus={gpu}", "host=node1").code == 0
    assert cli("set", "job=eval", "gpus=0", "host=node2").code == 0
    layout = KeyLayout(prefix)
    assert _age(store, prefix, host_stream(layout, "node1").prefix, days=8) == 2
    assert _age(store, prefix, host_stream(layout, "node2").prefix, days=8) == 1
    assert _age(store, prefix, policy_stream(layout).prefix, days=1) == 1

    assert cli("set", "job=train", "gpus=2", "host=node1").code == 0

    node1 = history_entries(cli, "host=node1", "job=train")
    assert [(e["seq"], e["to"]["gpus"]) for e in node1] == [(2, ["2"])]
    # node2 has had no append since: its old entry is still there, until a prune.
    assert [e["job"] for e in history_entries(cli, "host=node2", "job=eval")] == ["eval"]
    pruned = cli("history", "prune", "-o", "json")
    assert pruned.code == 0, pruned.err
    document = json.loads(pruned.out)
    assert list(schema("history-prune").iter_errors(document)) == []
    assert (document["entries_dropped"], document["streams_removed"]) == (1, [])
    assert history_entries(cli, "host=node2", "job=eval") == []
    assert [e["action"] for e in history_entries(cli, "host=node2")] == [
        "policy-apply"
    ]  # 1 day old


def test_prune_without_max_age_is_refused_in_one_line(applied: Cli) -> None:
    result = applied("history", "prune")
    assert result.code == 2
    assert result.err.strip().count("\n") == 0 and "history.max_age" in result.err


def test_validate_and_apply_refuse_an_oversized_history_with_exit_2_and_one_line(
    applied: Cli, tmp_path: Path
) -> None:
    policy = tmp_path / "fleet.yaml"
    policy.write_text(FLEET + "history: {entries_per_host: 1000}\n")

    for command in (["policy", "validate"], ["policy", "apply"]):
        result = applied(*command, str(policy))
        assert result.code == 2, result.err
        (line,) = result.err.strip().splitlines()
        assert "history.entries_per_host: 1,000 entries x 12,501 streams" in line
        assert "7.5 GiB" in line and "set history.entries_per_host: 67" in line
    assert len(history_entries(applied)) == 1  # the example's apply: the refused one wrote nothing
    policy.write_text(FLEET)
    assert run_cli(["policy", "validate", str(policy)], clean_env()).code == 0


def test_history_limit_20_shows_the_newest_20_across_hosts(
    cli: Cli, store: Store, prefix: str, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\nhosts:\n  node[01-30]: {gpus: 2}\n")
    assert cli("policy", "apply", str(policy)).code == 0
    start = datetime.now(UTC)  # after the policy's apply, as any writer's clock would be
    minutes = iter(range(10_000))
    allocator = Allocator(
        store,
        prefix=prefix,
        actor="alice@h",
        clock=lambda: start + timedelta(minutes=next(minutes)),
    )
    for round_ in range(3):  # every host in turn, three times: the newest are spread wide
        for host in range(1, 31):
            job = f"job{host % 4}"
            allocator.assign(Request(job=job, host=f"node{host:02d}", gpus=(round_ % 2,)))

    everything = history_entries(cli)
    newest = history_entries(cli, "--limit", "20")

    assert len(everything) == 90 + 1
    assert newest == everything[:20]
    assert [e["host"] for e in newest[:3]] == ["node30", "node29", "node28"]
