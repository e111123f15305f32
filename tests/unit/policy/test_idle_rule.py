"""The policy's ``idle:`` rule on pools and jobs: read strictly, job over pool, exemptions."""

from __future__ import annotations

import json

import pytest

from allocator.errors import PolicyError
from allocator.policy import load_policy, policy_json_schema

BASE = {
    "version": 1,
    "hosts": {"node1": {"gpus": 2}, "node2": {"gpus": 2}},
    "pools": {"a100": {"hosts": ["node1"], "idle": {"after": "2h", "action": "release"}}},
    "jobs": {
        "train": {"command": ["x"]},
        "serve": {"command": ["y"], "idle": {"action": "none"}},
        "notebook": {"command": ["z"], "idle": {"after": "30m", "threshold_percent": 10}},
    },
}


def _load(doc: dict[str, object]) -> object:
    return load_policy(json.dumps(doc), source="p.yaml")


def test_a_jobs_rule_wins_over_its_pools_and_none_exempts_it() -> None:
    policy = load_policy(json.dumps(BASE), source="p.yaml")
    rule, source = policy.idle_rule("train", "node1") or (None, "")
    assert rule is not None and (rule.after_seconds, rule.action, source) == (
        7200.0,
        "release",
        "pool a100",
    )
    assert policy.idle_rule("serve", "node1") is None
    own = policy.idle_rule("notebook", "node2")
    assert own is not None
    assert (own[0].after_seconds, own[0].action, own[0].threshold_percent, own[1]) == (
        1800.0,
        "warn",
        10.0,
        "job notebook",
    )
    assert policy.idle_rule("train", "node2") is None  # node2 is in no pool


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"after": 2}, "write it with a unit"),
        ({"after": "2"}, "add a unit"),
        ({"action": "release"}, "missing required field 'after'"),
        ({"after": "0s"}, "at least 1s"),
        ({"after": "400d"}, "at most 365d"),
        ({"after": "2h", "action": "kill"}, "one of warn, release, none"),
        ({"after": "2h", "threshold_percent": 0}, "must be > 0"),
        ({"after": "2h", "threshold_percent": 101}, "<= 100"),
        ({"after": "2h", "afer": "1h"}, "unknown key 'afer'"),
    ],
)
def test_a_bad_idle_rule_is_one_clear_error_with_its_line(
    rule: dict[str, object], message: str
) -> None:
    doc = json.loads(json.dumps(BASE))
    doc["jobs"]["train"]["idle"] = rule
    with pytest.raises(PolicyError) as caught:
        _load(doc)
    assert message in str(caught.value)
    assert "jobs.train.idle" in str(caught.value)
    assert len(caught.value.errors) == 1


def test_the_schema_describes_the_idle_rule_as_the_loader_reads_it() -> None:
    import jsonschema

    schema = policy_json_schema()
    jsonschema.validate(BASE, schema)
    bad = json.loads(json.dumps(BASE))
    bad["jobs"]["train"]["idle"] = {"action": "warn"}  # after missing
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    bad["jobs"]["train"]["idle"] = {"after": "2 hours"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_a_written_back_policy_keeps_the_rule_as_text() -> None:
    from allocator.policy import policy_to_dict

    data = policy_to_dict(load_policy(json.dumps(BASE), source="p.yaml"))
    assert data["pools"]["a100"]["idle"] == {
        "after": "2h",
        "action": "release",
        "threshold_percent": 5.0,
        "busy_cpu_percent": None,
    }
    assert data["jobs"]["train"]["idle"] is None
