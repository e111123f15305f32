"""The agent reads and watches only its share of the policy (and the common share).

An apply that changes another host writes nothing the agent watches; one
that changes its own host reaches it; a damaged share is refused with the
last good policy kept; and a store holding only the whole policy record (a
policy applied by an older version) still works.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from allocator.agent.sync.watches import agent_watch_keys
from allocator.policy import load_policy, policy_sha256
from allocator.policy.shares import share_record, split_policy
from allocator.store import open_store
from tests.e2e.agent_harness import HOST, AgentHarness, agent_policy
from tests.support.waiting import wait_for

OTHER = "node2"


@pytest.fixture
def world(tmp_path: Path, store_url: str, prefix: str) -> Iterator[AgentHarness]:
    """An agent on a 4-GPU host whose policy declares another host too."""
    harness = AgentHarness(tmp_path, store_url, prefix)
    with harness.running(policy=_policy(harness)):
        wait_for("the agent's policy", lambda: harness.events("policy"))
        yield harness


def _policy(world: AgentHarness, **changes: Any) -> dict[str, Any]:
    policy = agent_policy(world.workdir)
    policy["hosts"][OTHER] = {"gpus": 2}
    policy.update(changes)
    return policy


def _apply(world: AgentHarness, policy: dict[str, Any]) -> None:
    path = world.workdir / "changed.yaml"
    path.write_text(json.dumps(policy))  # JSON is YAML
    applied = world.cli("policy", "apply", str(path), "--force")
    assert applied.code == 0, applied.err


def _watched(world: AgentHarness) -> dict[str, int]:
    """The revision of every key under what the agent watches."""
    store = open_store(world.store_url)
    try:
        return {
            item.key: item.mod_revision
            for key in agent_watch_keys(world.layout, HOST)
            for item in store.list(key).items
        }
    finally:
        store.close()


def test_an_apply_elsewhere_writes_nothing_the_agent_watches_one_here_reaches_it(
    world: AgentHarness,
) -> None:
    assert world.cli("set", f"host={HOST}", "job=train", "gpus=2,3").code == 0
    first = world.new_report("train")
    before = _watched(world)
    assert world.layout.host_share(HOST) in before and world.layout.common_share in before

    _apply(world, _policy(world, hosts={HOST: {"gpus": 4}, OTHER: {"gpus": 8}}))
    assert _watched(world) == before

    reserved = [{"name": "eval", "host": HOST, "gpus": [3], "for": ["eval-*"]}]
    _apply(world, _policy(world, reservations=reserved))
    assert _watched(world).keys() == before.keys() and _watched(world) != before
    moved = world.new_report("train", not_pid=first["pid"], timeout=20)
    assert moved["env"]["ALLOCATOR_FALLBACK_REASON"].startswith("GPU 3 reserved by 'eval'")


def test_a_damaged_share_is_refused_and_the_last_good_policy_kept(world: AgentHarness) -> None:
    assert world.cli("set", f"host={HOST}", "job=train", "gpus=1").code == 0
    first = world.new_report("train")
    key = world.layout.host_share(HOST)
    world.put_raw(key, b"garbage")
    wait_for("the bad share reported", lambda: world.events("bad-record", key=key))
    world.put_raw(world.layout.common_share, b'{"also": "garbage"}')
    common = world.layout.common_share
    wait_for("the bad common share reported", lambda: world.events("bad-record", key=common))
    assert len(world.events("policy")) == 1
    assert world.report("train") == first  # the worker runs on, untouched

    world.apply_policy(_policy(world, hosts={HOST: {"gpus": 3}, OTHER: {"gpus": 2}}))
    wait_for("the repaired shares taken", lambda: len(world.events("policy")) == 2)


def test_an_agent_reads_the_whole_policy_when_no_shares_are_stored(
    tmp_path: Path, store_url: str, prefix: str
) -> None:
    harness = AgentHarness(tmp_path, store_url, prefix)
    try:
        harness.apply_policy(_policy(harness))
        store = open_store(store_url)
        try:  # what a policy applied by a version without shares leaves
            for item in store.list(harness.layout.shares).items:
                store.delete(item.key)
        finally:
            store.close()
        harness.start_agent()
        assert harness.cli("set", f"host={HOST}", "job=train", "gpus=0").code == 0
        assert harness.new_report("train")["env"]["CUDA_VISIBLE_DEVICES"]
    finally:
        harness.cleanup()


def test_a_host_share_of_an_apply_still_writing_waits_for_its_common_share(
    world: AgentHarness,
) -> None:
    """Shares written before the apply's transaction are taken only once it wrote the common one."""
    text = json.dumps(_policy(world, hosts={HOST: {"gpus": 3}, OTHER: {"gpus": 2}}))
    shares = split_policy(load_policy(text))
    sha = policy_sha256(text)
    world.put_raw(world.layout.host_share(HOST), share_record(shares.hosts[HOST], sha))
    wait_for("the share seen and waited on", lambda: world.events("policy-pending"))
    assert len(world.events("policy")) == 1  # the last good policy stays

    world.put_raw(world.layout.common_share, share_record(shares.common, sha, in_txn=True))
    wait_for("both shares taken", lambda: len(world.events("policy")) == 2)
