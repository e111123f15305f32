"""A pool's sharing mode and a job's exclusive and cpu_affinity fields, as the policy file says."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import jsonschema
import pytest

from allocator.cli import main
from allocator.errors import PolicyError
from allocator.policy import Sharing, lint_policy, load_policy, policy_json_schema, policy_to_dict
from allocator.policy.sharing_field import SHARED

NOW = datetime(2027, 6, 1, tzinfo=UTC)


def pool_policy(sharing: str) -> str:
    return (
        f"version: 1\nhosts: {{a: {{gpus: 2}}}}\npools:\n  p: {{hosts: [a], sharing: {sharing}}}\n"
    )


@pytest.mark.parametrize(
    ("written", "meant"),
    [
        ("exclusive", Sharing()),
        ("{mode: exclusive}", Sharing()),
        ("{mode: time-slice, slots: 4}", Sharing("time-slice", 4)),
        ("{mode: mps, slots: 7}", Sharing("mps", 7)),
        ("shared", SHARED),
    ],
)
def test_each_sharing_mode_loads_and_writes_back_the_same(written: str, meant: Sharing) -> None:
    policy = load_policy(pool_policy(written))
    assert policy.pools["p"].sharing == meant
    again = load_policy(pool_policy(_flow(policy_to_dict(policy)["pools"]["p"]["sharing"])))
    assert again.pools["p"].sharing == meant


def _flow(value: object) -> str:
    return (
        value
        if isinstance(value, str)
        else "{"
        + ", ".join(
            f"{k}: {v}"
            for k, v in value.items()  # type: ignore[attr-defined]
        )
        + "}"
    )


def test_a_pool_is_exclusive_unless_it_says_otherwise() -> None:
    policy = load_policy("version: 1\nhosts: {a: {gpus: 1}}\npools: {p: {hosts: [a]}}\n")
    assert policy.pools["p"].sharing == Sharing() and not policy.pools["p"].sharing.shared


@pytest.mark.parametrize(
    ("written", "error"),
    [
        ("{mode: mps}", "pools.p.sharing: mode mps needs slots"),
        ("{mode: time-slice, slots: ~}", "pools.p.sharing: mode time-slice needs slots"),
        ("{mode: exclusive, slots: 2}", "pools.p.sharing.slots: slots is only valid with mode"),
        ("{mode: mps, slots: 0}", "pools.p.sharing.slots: must be >= 1, got 0"),
        ("{mode: mps, slots: 300}", "must be <= 256 (256 jobs on one GPU"),
        ("{mode: mps, slot: 2}", "unknown key 'slot' (did you mean 'slots'?)"),
        ("{mode: spatial, slots: 2}", "expected one of exclusive, time-slice, mps"),
        ("sharde", "(did you mean 'shared'?)"),
        ("{slots: 2}", "missing required field 'mode'"),
    ],
)
def test_a_sharing_mode_that_cannot_work_is_one_clear_error(written: str, error: str) -> None:
    with pytest.raises(PolicyError) as info:
        load_policy(pool_policy(written))
    assert error in str(info.value)
    assert "(and " not in str(info.value)  # one problem, said once


def test_shared_still_loads_with_a_deprecation_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, warnings = lint_policy(pool_policy("shared"), "p.yaml", NOW)
    assert [(w.line, w.field) for w in warnings] == [(4, "pools.p.sharing")]
    assert "sharing: shared is deprecated" in warnings[0].reason
    assert lint_policy(pool_policy("{mode: time-slice, slots: 2}"), "p.yaml", NOW)[1] == ()
    path = tmp_path / "p.yaml"
    path.write_text(pool_policy("shared"))
    assert main(["policy", "validate", "--strict", str(path)]) == 2
    assert "deprecated" in capsys.readouterr().err


def test_the_schema_accepts_and_refuses_sharing_as_the_loader_does() -> None:
    validator = jsonschema.Draft202012Validator(policy_json_schema())
    base = {"version": 1, "hosts": {"a": {"gpus": 1}}}
    good = [
        "exclusive",
        "shared",
        {"mode": "mps", "slots": 2},
        {"mode": "exclusive"},
        {"mode": "time-slice", "slots": 1},
    ]
    bad = [
        {"mode": "mps"},
        {"mode": "exclusive", "slots": 2},
        "spatial",
        {"mode": "mps", "slots": 0},
    ]
    for sharing in good:
        validator.validate({**base, "pools": {"p": {"hosts": ["a"], "sharing": sharing}}})
        load_policy(pool_policy(_flow(sharing)))
    for sharing in bad:
        with pytest.raises(jsonschema.ValidationError):
            validator.validate({**base, "pools": {"p": {"sharing": sharing}}})
        with pytest.raises(PolicyError):
            load_policy(pool_policy(_flow(sharing)))


def test_a_job_says_whether_it_takes_gpus_whole_and_whether_it_is_pinned() -> None:
    policy = load_policy(
        "version: 1\njobs:\n  a: {command: [x], exclusive: true, cpu_affinity: none}\n"
        "  b: {command: [y]}\n"
    )
    assert (policy.jobs["a"].exclusive, policy.jobs["a"].cpu_affinity) == (True, "none")
    assert (policy.jobs["b"].exclusive, policy.jobs["b"].cpu_affinity) == (False, "local")
    with pytest.raises(PolicyError, match="expected one of local, none"):
        load_policy("version: 1\njobs:\n  a: {command: [x], cpu_affinity: numa}\n")
