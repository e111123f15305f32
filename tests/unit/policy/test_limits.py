"""Sizes are bounded before work is done: counts, text, aliases, values that are mistakes."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocator.errors import PolicyError
from allocator.policy import MAX_POLICY_BYTES, load_policy, read_policy_text


def errors_of(text: str) -> list[tuple[int | None, str | None, str]]:
    """Every problem of ``text`` as (line, field, reason)."""
    with pytest.raises(PolicyError) as info:
        load_policy(text, "policy.yaml")
    assert "\n" not in str(info.value)
    return [(e.line, e.field, e.reason) for e in info.value.errors]


def job_with(setting: str) -> str:
    return f"version: 1\njobs:\n  a:\n    command: [x]\n    {setting}\n"


def test_a_host_cannot_declare_more_gpus_than_any_part_accepts() -> None:
    assert errors_of("version: 1\nhosts:\n  big: {gpus: 1000000000000}\n") == [
        (
            3,
            "hosts.big.gpus",
            "must be <= 1,024 (a host has at most 1,024 GPUs, indices 0-1,023), "
            "got 1,000,000,000,000",
        )
    ]
    assert load_policy("version: 1\nhosts:\n  big: {gpus: 1024}\n").hosts["big"].gpus == 1024


def test_reserved_gpu_indices_and_pool_limits_are_bounded_like_the_cli() -> None:
    text = (
        "version: 1\nhosts: {n1: {gpus: 4}}\n"
        "pools: {p: {hosts: [n1], max_gpus_per_job: 5000}}\n"
        "reservations: [{name: r, host: n1, gpus: [1024], for: [x]}]\n"
    )
    found = {(field, reason.split(" (")[0]) for _, field, reason in errors_of(text)}
    assert found == {
        ("pools.p.max_gpus_per_job", "must be <= 1,024"),
        ("reservations[0].gpus[0]", "must be <= 1,023"),
    }


def test_the_whole_fleet_is_bounded_too() -> None:
    hosts = "".join(f"  h{i}: {{gpus: 1024}}\n" for i in range(257))
    ((line, field, reason),) = errors_of("version: 1\nhosts:\n" + hosts)
    assert (line, field) == (2, "hosts")
    assert reason == "the hosts declare 263,168 GPUs together; at most 262,144 in one policy"


@pytest.mark.parametrize(
    ("setting", "field", "reason"),
    [
        (
            "grace_seconds: 1e308",
            "jobs.a.grace_seconds",
            "must be <= 3600 (an hour; longer and a hung worker holds its GPUs), got 1e+308",
        ),
        ("max_restarts: 99999999", "jobs.a.max_restarts", "must be <= 10,000, got 99,999,999"),
        (
            "restart_backoff_max_seconds: 1e9",
            "jobs.a.restart_backoff_max_seconds",
            "must be <= 86400 (a day), got 1e+09",
        ),
    ],
)
def test_job_numbers_that_can_only_be_mistakes_are_refused(
    setting: str, field: str, reason: str
) -> None:
    assert errors_of(job_with(setting)) == [(5, field, reason)]


def test_health_checks_cannot_run_on_every_loop_nor_never() -> None:
    found = errors_of(
        "version: 1\nhealth:\n  interval_seconds: 1e-300\n  recovery_probe_timeout_seconds: 1e-9\n"
    )
    assert found == [
        (3, "health.interval_seconds", "must be >= 0.1, got 1e-300"),
        (4, "health.recovery_probe_timeout_seconds", "must be >= 1, got 1e-09"),
    ]


def test_cpu_threads_beyond_any_machine_are_refused() -> None:
    found = errors_of("version: 1\nfallback:\n  cpu: {action: cpu, threads: 100000}\n")
    assert found == [
        (
            3,
            "fallback.cpu.threads",
            "must be <= 4,096 (more CPU threads than any machine has), got 100,000",
        )
    ]


@pytest.mark.parametrize(
    ("signal_name", "why"),
    [
        ("SIGTSTP", "a stop signal would suspend the workers, holding their GPUs"),
        ("SIGTTIN", "a stop signal would suspend the workers, holding their GPUs"),
        ("SIGCHLD", "programs ignore it by default"),
        (
            "SIGRTMIN",
            "real-time signals are ignored by default and numbered differently per system",
        ),
        ("SIGSEGV", "it reports a fault, so the worker would look crashed"),
    ],
)
def test_on_change_refuses_signals_that_cannot_mean_reload(signal_name: str, why: str) -> None:
    ((_, field, reason),) = errors_of(job_with(f"on_change: signal:{signal_name}"))
    assert field == "jobs.a.on_change"
    assert reason.startswith(f"{signal_name} cannot tell a worker its GPUs changed: {why}; use ")


@pytest.mark.parametrize("name", ["SIGHUP", "SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGWINCH"])
def test_on_change_accepts_the_signals_programs_reload_on(name: str) -> None:
    policy = load_policy(job_with(f"on_change: signal:{name}"))
    assert policy.jobs["a"].on_change == f"signal:{name}"


@pytest.mark.parametrize(
    ("glob", "why"),
    [
        ("[abc", "one of its positions can hold no character a job name may contain"),
        ("-eval*", "job names never start with '-'"),
        ("..", "'.' and '..' are not job names"),
        ("x" * 64, "it needs 64 characters or more; names have at most 63"),
    ],
)
def test_a_reservation_glob_no_job_name_can_match_is_refused(glob: str, why: str) -> None:
    ((_, field, reason),) = errors_of(
        "version: 1\nhosts: {n1: {gpus: 1}}\n"
        f"reservations: [{{name: r, host: n1, gpus: [0], for: ['{glob}']}}]\n"
    )
    assert field == "reservations[0].for[0]"
    assert reason == f"job glob {glob!r} can never match a job name: {why}"


def test_long_lists_and_strings_are_refused_before_their_items_are_read() -> None:
    command = "[" + ",".join(["x"] * 4097) + "]"
    long_env = "y" * 70_000
    found = errors_of(
        f"version: 1\njobs:\n  a: {{command: {command}}}\n  b: {{command: [x], cwd: {long_env}}}\n"
    )
    assert found == [
        (3, "jobs.a.command", "has 4,097 arguments; at most 4,096"),
        (4, "jobs.b.cwd", "is 70,000 characters long; at most 4,096"),
    ]


# --- aliases ------------------------------------------------------------------


def test_aliases_that_multiply_the_document_are_refused_where_the_anchor_is() -> None:
    # The issue's file was 3,000 jobs aliasing one 20,000-item command (2 GB to
    # read); this one is small enough that the old loader got through it too.
    command = "[" + ",".join(["x"] * 2000) + "]"
    jobs = "".join(f"  j{i}: {{command: *cmd}}\n" for i in range(300))
    text = f"version: 1\njobs:\n  base: {{command: &cmd {command}}}\n{jobs}"
    ((line, field, reason),) = errors_of(text)
    assert (line, field) == (3, None)
    assert reason.startswith("aliases expand the policy to 603,209 YAML nodes from the 2,909")
    assert reason.endswith("the node here is used 301 times")


def test_the_issues_alias_bomb_is_refused_before_it_is_read() -> None:
    command = "[" + ",".join(["x"] * 20_000) + "]"
    jobs = "".join(f"  j{i}: {{command: *cmd}}\n" for i in range(3000))
    text = f"version: 1\njobs:\n  base: {{command: &cmd {command}}}\n{jobs}"
    ((line, _, reason),) = errors_of(text)
    assert line == 3 and reason.startswith("aliases expand the policy to 60,032,")


def test_templates_shared_by_many_jobs_are_fine() -> None:
    template = "  base: &b {command: [python, -m, w], env: {A: '1', B: '2'}, grace_seconds: 3}\n"
    jobs = "".join(f"  j{i}: {{<<: *b, max_restarts: 2}}\n" for i in range(2000))
    policy = load_policy(f"version: 1\njobs:\n{template}{jobs}")
    assert len(policy.jobs) == 2001 and policy.jobs["j7"].env == {"A": "1", "B": "2"}


def test_an_alias_inside_its_own_anchor_is_refused() -> None:
    ((line, _, reason),) = errors_of("version: 1\njobs:\n  a: {command: &c [x, *c]}\n")
    assert line == 3
    assert reason == "an alias refers to a node that contains it (a recursive structure)"


# --- size ------------------------------------------------------------------------


def _padded(size: int) -> str:
    """A valid policy of about ``size`` bytes: comment lines of 100 bytes."""
    head = "version: 1\n"
    lines = (size - len(head)) // 100
    return head + ("#" * 99 + "\n") * lines


def test_a_policy_larger_than_the_store_holds_is_refused_with_the_line_it_passes_the_limit(
    tmp_path: Path,
) -> None:
    text = _padded(MAX_POLICY_BYTES + 1000)
    path = tmp_path / "big.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError) as info:
        read_policy_text(path)
    assert info.value.line == text[:MAX_POLICY_BYTES].count("\n") + 1
    assert "too large" in info.value.reason
    with pytest.raises(PolicyError) as loaded:
        load_policy(text, "big.yaml")
    assert loaded.value.line is not None and "too large to store" in loaded.value.reason


def test_escaping_counts_toward_the_limit_as_the_store_keeps_it() -> None:
    # Each double quote (and line break) takes two bytes in the stored JSON:
    # this file is about two thirds of the limit, and a third over it as stored.
    lines = MAX_POLICY_BYTES // 150
    text = "version: 1\n" + ("#" + '"' * 98 + "\n") * lines
    with pytest.raises(PolicyError) as info:
        load_policy(text, "quotes.yaml")
    assert "as stored, JSON-escaped" in info.value.reason
    assert info.value.line is not None and info.value.line < lines


def test_a_policy_just_under_the_limit_loads() -> None:
    # 100-byte lines are 101 bytes as stored (the line break is escaped)
    assert load_policy(_padded(MAX_POLICY_BYTES * 100 // 101 - 200)).version == 1


def test_the_policy_size_limit_is_the_stores_value_limit() -> None:
    # The policy imports no store, so it keeps its own copy of the limit.
    from allocator.policy.limits import STORE_VALUE_BYTES
    from allocator.store.base import MAX_VALUE_BYTES

    assert STORE_VALUE_BYTES == MAX_VALUE_BYTES
