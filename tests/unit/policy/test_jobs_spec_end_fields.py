"""Job fields: ``restart``, ``release_on_exit`` (jobs that end) and ``workers: torchrun``."""

from __future__ import annotations

import pytest

from allocator.errors import PolicyError
from allocator.policy import load_policy, policy_to_dict


def job_policy(fields: str) -> str:
    return f"version: 1\nhosts: {{a: {{gpus: 1}}}}\njobs:\n  j:\n    command: [x]\n{fields}"


@pytest.mark.parametrize(
    ("written", "statuses", "dumped"),
    [
        ("", (), False),
        ("    release_on_exit: false\n", (), False),
        ("    release_on_exit: true\n", (0,), True),
        ("    release_on_exit: [3, 0, 143]\n", (0, 3, 143), [0, 3, 143]),
        ("    release_on_exit: [0]\n", (0,), True),
    ],
)
def test_release_on_exit_is_a_flag_or_the_statuses(
    written: str, statuses: tuple[int, ...], dumped: object
) -> None:
    policy = load_policy(job_policy(written))
    assert policy.jobs["j"].release_on_exit == statuses
    assert policy_to_dict(policy)["jobs"]["j"].get("release_on_exit") == dumped


def test_restart_defaults_to_what_the_agent_always_did() -> None:
    assert load_policy(job_policy("")).jobs["j"].restart == "on-failure"
    for rule in ("always", "on-failure", "never"):
        assert load_policy(job_policy(f"    restart: {rule}\n")).jobs["j"].restart == rule
    assert load_policy(job_policy("    workers: torchrun\n")).jobs["j"].workers == "torchrun"


@pytest.mark.parametrize(
    ("written", "error"),
    [
        ("    restart: sometimes\n", "jobs.j.restart: expected one of always, on-failure, never"),
        ("    release_on_exit: yes\n", "jobs.j.release_on_exit"),
        ("    release_on_exit: [0, 0]\n", "exit status 0 is listed twice"),
        ("    release_on_exit: [256]\n", "must be <= 192"),
        ("    release_on_exit: []\n", "needs at least 1 exit status"),
        ("    release_on_exit: ok\n", "expected a boolean"),
    ],
)
def test_a_bad_end_rule_is_one_clear_error(written: str, error: str) -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy(job_policy(written))
    assert error in str(caught.value)


def test_validate_warns_about_a_reference_no_worker_gets() -> None:
    from datetime import UTC, datetime

    from allocator.policy import lint_policy

    command = '    command: [x, "$(ALLOCATOR_GPU_COUNT)", "$(DATA)", "$$(TEXT)", "$(NOPE)"]\n'
    text = job_policy("    env: {DATA: /d}\n").replace("    command: [x]\n", command)
    _, warnings = lint_policy(text, "p.yaml", datetime(2026, 1, 1, tzinfo=UTC))
    assert [(w.field, w.line) for w in warnings] == [("jobs.j.command[4]", 5)]
    assert "$(NOPE) names no variable of the job's workers" in warnings[0].reason
