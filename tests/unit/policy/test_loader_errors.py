"""Every kind of policy mistake: one line naming file, line and field, exit code 2."""

from __future__ import annotations

import textwrap

import pytest

from allocator.errors import EXIT_INVALID, PolicyError
from allocator.policy import load_policy


def errors_of(text: str) -> tuple[PolicyError, ...]:
    """Load ``text`` (dedented) as policy.yaml; return every reported problem."""
    with pytest.raises(PolicyError) as info:
        load_policy(textwrap.dedent(text).lstrip("\n"), "policy.yaml")
    assert info.value.exit_code == EXIT_INVALID
    assert "\n" not in str(info.value)
    return info.value.errors


def only_error(text: str) -> PolicyError:
    """Load ``text``; assert exactly one problem is reported and return it."""
    errors = errors_of(text)
    assert len(errors) == 1, [str(e) for e in errors]
    return errors[0]


def test_unknown_fallback_rule_names_file_line_field_and_defined_rules() -> None:
    error = only_error(
        """
        version: 1
        jobs:
          train:
            command: [python, -m, train]
            fallback: cpu-9
        fallback:
          cpu-8: {action: cpu, threads: 8}
        """
    )
    assert str(error) == (
        "policy.yaml:5: jobs.train.fallback: unknown fallback rule 'cpu-9' (defined: cpu-8)"
    )
    assert (error.file, error.line, error.field) == ("policy.yaml", 5, "jobs.train.fallback")


def test_unknown_fallback_rule_when_none_is_defined() -> None:
    error = only_error(
        """
        version: 1
        jobs:
          train: {command: [x], fallback: cpu-8}
        """
    )
    assert error.reason == "unknown fallback rule 'cpu-8' (defined: none)"


def test_unknown_key_suggests_the_closest_known_key() -> None:
    error = only_error(
        """
        version: 1
        jobs:
          train:
            command: [x]
            fallbak: cpu-8
        """
    )
    assert (error.line, error.field) == (5, "jobs.train.fallbak")
    assert error.reason == "unknown key 'fallbak' (did you mean 'fallback'?)"


def test_unknown_key_without_a_close_match_lists_the_allowed_keys() -> None:
    error = only_error(
        """
        version: 1
        hosts:
          node1: {gpus: 2, colour: red}
        """
    )
    assert (error.line, error.field) == (3, "hosts.node1.colour")
    assert error.reason == "unknown key 'colour' (allowed: gpus, pool, vendor, cdi_names)"


def test_unknown_top_level_section() -> None:
    error = only_error("version: 1\njob:\n  a: {command: [x]}\n")
    assert (error.line, error.field) == (2, "job")
    assert "did you mean 'jobs'?" in error.reason


@pytest.mark.parametrize(
    ("line", "field", "reason"),
    [
        ("gpus: four", "hosts.node1.gpus", "expected an integer, got a string ('four')"),
        ("gpus: 1.5", "hosts.node1.gpus", "expected an integer, got a number (1.5)"),
        ("gpus: true", "hosts.node1.gpus", "expected an integer, got a boolean (true)"),
        ("gpus: [1]", "hosts.node1.gpus", "expected an integer, got a list"),
        ("gpus: -1", "hosts.node1.gpus", "must be >= 0, got -1"),
    ],
)
def test_wrong_type_says_expected_and_got(line: str, field: str, reason: str) -> None:
    error = only_error(f"version: 1\nhosts:\n  node1:\n    {line}\n")
    assert (error.line, error.field, error.reason) == (4, field, reason)


def test_string_field_given_a_number_suggests_quoting() -> None:
    error = only_error(
        """
        version: 1
        jobs:
          train:
            command: [x]
            env: {OMP_NUM_THREADS: 8}
        """
    )
    assert (error.line, error.field) == (5, "jobs.train.env.OMP_NUM_THREADS")
    assert error.reason == (
        "expected a string, got an integer (8); quote it if you mean the text '8'"
    )


def test_command_must_be_a_non_empty_list() -> None:
    errors = errors_of(
        """
        version: 1
        jobs:
          a: {command: python}
          b: {command: []}
          c: {command: [python, ""]}
        """
    )
    found = {(e.line, e.field, e.reason) for e in errors}
    assert found == {
        (3, "jobs.a.command", "expected a list, got a string ('python')"),
        (4, "jobs.b.command", "needs at least 1 argument(s)"),
        (5, "jobs.c.command[1]", "must not be empty"),
    }


def test_missing_required_field_points_at_the_entry() -> None:
    error = only_error(
        """
        version: 1
        jobs:
          train:
            cwd: /srv/train
        """
    )
    assert (error.line, error.field) == (3, "jobs.train")
    assert error.reason == "missing required field 'command'"


def test_missing_version() -> None:
    error = only_error("hosts:\n  node1: {gpus: 1}\n")
    assert error.line == 1
    assert error.field is None
    assert error.reason == "missing required field 'version'"
    assert str(error) == "policy.yaml:1: missing required field 'version'"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("2", "unsupported policy version 2 (this allocator reads version 1)"),
        ("'1'", "expected 1, got a string ('1')"),
    ],
)
def test_version_must_be_1(value: str, reason: str) -> None:
    error = only_error(f"version: {value}\n")
    assert (error.line, error.field, error.reason) == (1, "version", reason)


def test_host_names_an_unknown_pool() -> None:
    error = only_error(
        """
        version: 1
        hosts:
          node1: {gpus: 4, pool: a10}
        pools:
          a100: {}
          default: {}
        """
    )
    assert (error.line, error.field) == (3, "hosts.node1.pool")
    assert error.reason == "unknown pool 'a10' (defined: a100, default)"


def test_pool_lists_an_undeclared_host() -> None:
    error = only_error(
        """
        version: 1
        hosts:
          node1: {gpus: 4}
        pools:
          default:
            hosts:
              - node1
              - node9
        """
    )
    assert (error.line, error.field) == (8, "pools.default.hosts[1]")
    assert error.reason == "unknown host 'node9' (declared: node1)"


def test_host_in_two_pools() -> None:
    error = only_error(
        """
        version: 1
        hosts:
          node1: {gpus: 4}
        pools:
          a: {hosts: [node1]}
          b: {hosts: [node1]}
        """
    )
    assert (error.line, error.field) == (6, "pools.b.hosts[0]")
    assert (
        error.reason == "host 'node1' is already in pool 'a' (line 5); a host belongs to one pool"
    )


def test_host_pool_disagrees_with_the_pool_listing_it() -> None:
    error = only_error(
        """
        version: 1
        hosts:
          node2: {gpus: 8, pool: a100}
        pools:
          a100: {}
          default: {hosts: [node2]}
        """
    )
    assert (error.line, error.field) == (3, "hosts.node2.pool")
    assert error.reason == "host 'node2' says pool 'a100' but pool 'default' lists it (line 6)"


def test_pool_listed_twice_in_one_pool() -> None:
    error = only_error(
        """
        version: 1
        hosts: {node1: {gpus: 1}}
        pools:
          a: {hosts: [node1, node1]}
        """
    )
    assert (error.line, error.field) == (4, "pools.a.hosts[1]")
    assert error.reason == "host 'node1' is listed twice (first at pools.a.hosts[0])"


RESERVATION_HEAD = """\
version: 1
hosts:
  node1: {gpus: 4}
  node2: {gpus: 2}
reservations:
"""


def reservation_errors(body: str) -> tuple[PolicyError, ...]:
    """Problems of a policy with two hosts (node1: 4 GPUs, node2: 2) and ``body`` reservations.

    The first reservation line of ``body`` is line 6.
    """
    return errors_of(RESERVATION_HEAD + textwrap.dedent(body).lstrip("\n"))


def test_reservation_names_an_unknown_host() -> None:
    (error,) = reservation_errors("- {name: r, host: node7, gpus: [0], for: [x]}\n")
    assert (error.line, error.field) == (6, "reservations[0].host")
    assert error.reason == "unknown host 'node7' (declared: node1, node2)"


def test_reservation_gpu_outside_the_host_inventory() -> None:
    (error,) = reservation_errors(
        """
        - name: r
          host: node1
          gpus:
            - 3
            - 4
          for: [x]
        """
    )
    assert (error.line, error.field) == (10, "reservations[0].gpus[1]")
    assert error.reason == "GPU 4 is not on host 'node1', which has 4 GPUs (0-3)"


def test_reservation_gpu_must_not_be_negative() -> None:
    (error,) = reservation_errors("- {name: r, host: node1, gpus: [-1], for: [x]}\n")
    assert (error.line, error.field) == (6, "reservations[0].gpus[0]")
    assert error.reason == "must be >= 0, got -1"


def test_reservation_lists_a_gpu_twice() -> None:
    (error,) = reservation_errors("- {name: r, host: node1, gpus: [1, 2, 1], for: [x]}\n")
    assert (error.line, error.field) == (6, "reservations[0].gpus[2]")
    assert error.reason == "GPU 1 is listed twice (first at reservations[0].gpus[0])"


def test_overlapping_reservations_of_a_shared_gpu() -> None:
    (error,) = reservation_errors(
        """
        - name: nightly
          host: node1
          gpus: [2, 3]
          for: [eval-*]
          start: 2027-01-01T00:00:00Z
          until: 2027-02-01T00:00:00Z
        - name: weekly
          host: node1
          gpus: [3]
          for: [bench-*]
          start: 2027-01-31T12:00:00+02:00
        """
    )
    assert (error.line, error.field) == (14, "reservations[1].gpus")
    assert error.reason == (
        "GPU 3 on host 'node1' is also reserved by 'nightly' (line 6) in an overlapping window"
    )


def test_reservations_that_do_not_overlap_are_accepted() -> None:
    text = RESERVATION_HEAD + textwrap.dedent(
        """\
        - {name: a, host: node1, gpus: [3], for: [x], until: 2027-01-01T00:00:00Z}
        - {name: b, host: node1, gpus: [3], for: [w], start: 2027-01-01T00:00:00Z}
        - {name: c, host: node1, gpus: [2], for: [z]}
        - {name: d, host: node2, gpus: [1], for: [z]}
        - {name: e, host: node2, gpus: [0], for: [z]}
        """
    )
    policy = load_policy(text, "policy.yaml")
    assert [r.name for r in policy.reservations] == ["a", "b", "c", "d", "e"]


def test_reservation_until_before_start() -> None:
    (error,) = reservation_errors(
        """
        - name: r
          host: node1
          gpus: [0]
          for: [x]
          start: 2027-02-01T00:00:00Z
          until: 2027-01-01T00:00:00Z
        """
    )
    assert (error.line, error.field) == (11, "reservations[0].until")
    assert error.reason == "until (2027-01-01T00:00:00Z) must be after start (2027-02-01T00:00:00Z)"


def test_reservation_empty_window_is_refused() -> None:
    (error,) = reservation_errors(
        "- {name: r, host: node1, gpus: [0], for: [x], "
        "start: 2027-01-01T00:00:00Z, until: 2027-01-01T00:00:00Z}\n"
    )
    assert error.field == "reservations[0].until"


def test_duplicate_reservation_names() -> None:
    (error,) = reservation_errors(
        """
        - {name: r, host: node1, gpus: [0], for: [x]}
        - {name: r, host: node2, gpus: [0], for: [x]}
        """
    )
    assert (error.line, error.field) == (7, "reservations[1].name")
    assert error.reason == "duplicate reservation name 'r' (first at line 6)"


def test_reservation_without_timezone_is_refused() -> None:
    errors = reservation_errors(
        """
        - {name: a, host: node1, gpus: [0], for: [x], until: 2027-01-01T00:00:00}
        - {name: b, host: node1, gpus: [1], for: [x], until: '2027-01-01 10:00'}
        - {name: c, host: node1, gpus: [2], for: [x], until: 2027-01-01}
        - {name: d, host: node1, gpus: [3], for: [x], until: next week}
        """
    )
    found = {(e.line, e.field, e.reason) for e in errors}
    assert found == {
        (
            6,
            "reservations[0].until",
            "timestamp '2027-01-01T00:00:00' has no timezone; "
            "add Z for UTC or an offset like +02:00",
        ),
        (
            7,
            "reservations[1].until",
            "expected an RFC 3339 time with a timezone, like 2027-01-01T00:00:00Z, "
            "got a string ('2027-01-01 10:00')",
        ),
        (
            8,
            "reservations[2].until",
            "expected an RFC 3339 time with a timezone, like 2027-01-01T00:00:00Z, "
            "got a date without a time (2027-01-01)",
        ),
        (
            9,
            "reservations[3].until",
            "expected an RFC 3339 time with a timezone, like 2027-01-01T00:00:00Z, "
            "got a string ('next week')",
        ),
    }


def test_reservation_job_globs_are_checked() -> None:
    (error,) = reservation_errors("- {name: r, host: node1, gpus: [0], for: ['a b']}\n")
    assert error.field == "reservations[0].for[0]"
    assert "job glob 'a b' may contain only" in error.reason


def test_threads_only_valid_for_action_cpu() -> None:
    errors = errors_of(
        """
        version: 1
        fallback:
          wait: {action: wait, threads: 2}
          cpu-0: {action: cpu, threads: 0}
          bad: {action: gpu}
        """
    )
    found = {(e.line, e.field, e.reason) for e in errors}
    assert found == {
        (
            3,
            "fallback.wait.threads",
            "threads is only valid with action 'cpu' (this rule's action is 'wait')",
        ),
        (4, "fallback.cpu-0.threads", "must be >= 1, got 0"),
        (
            5,
            "fallback.bad.action",
            "expected one of cpu, wait, fail, got a string ('gpu') (did you mean 'cpu'?)",
        ),
    }


@pytest.mark.parametrize(
    ("text", "line", "field", "reason"),
    [
        (
            "version: 1\njobs:\n  bad/name: {command: [x]}\n",
            3,
            "jobs.bad/name",
            "job name 'bad/name' may contain only ASCII letters, digits, '.', '_' and '-'",
        ),
        (
            "version: 1\nhosts:\n  '..': {gpus: 1}\n",
            3,
            "hosts...",
            "host name '..' is not allowed",
        ),
        (
            "version: 1\nfallback:\n  -x: {action: fail}\n",
            3,
            "fallback.-x",
            "fallback rule name '-x' is not allowed",
        ),
        (
            f"version: 1\npools:\n  {'p' * 64}: {{}}\n",
            3,
            f"pools.{'p' * 64}",
            "pool name is 64 characters long; at most 63",
        ),
        (
            "version: 1\nhosts: {n: {gpus: 1}}\n"
            "reservations:\n  - {name: a b, host: n, gpus: [0], for: [x]}\n",
            4,
            "reservations[0].name",
            "reservation 'a b' may contain only ASCII letters, digits, '.', '_' and '-'",
        ),
    ],
)
def test_invalid_names(text: str, line: int, field: str, reason: str) -> None:
    error = only_error(text)
    assert (error.line, error.field, error.reason) == (line, field, reason)


def test_an_invalid_entry_is_not_reported_again_where_referenced() -> None:
    errors = errors_of(
        """
        version: 1
        hosts:
          node1: {gpus: many}
        pools:
          default: {hosts: [node1]}
        jobs:
          train: {command: [x], fallback: cpu-8}
        fallback:
          cpu-8: {action: gpu}
        """
    )
    assert [e.field for e in errors] == ["hosts.node1.gpus", "fallback.cpu-8.action"]


def test_yaml_syntax_error_has_its_line() -> None:
    error = only_error(
        """
        version: 1
        jobs:
          train:
            command: [python, -m
            env: {}
        """
    )
    assert error.file == "policy.yaml"
    assert error.line == 5
    assert error.reason.startswith("invalid YAML: ")


def test_yaml_bad_indentation() -> None:
    error = only_error("version: 1\njobs:\n  a: {command: [x]}\n b: 2\n")
    assert error.line == 4
    assert error.reason.startswith("invalid YAML: ")


def test_several_documents_are_refused() -> None:
    error = only_error("version: 1\n---\nversion: 1\n")
    assert error.line == 2
    assert error.reason == (
        "invalid YAML: expected a single document in the stream, but found another document"
    )


def test_control_characters_are_refused_with_their_line() -> None:
    error = only_error("version: 1\njobs: \x07\n")
    assert error.line == 2
    assert error.reason.startswith("invalid YAML: character #x0007 is not allowed")


@pytest.mark.parametrize(
    ("text", "line", "field", "first"),
    [
        ("version: 1\nhosts: {}\nversion: 1\n", 3, "version", 1),
        (
            "version: 1\njobs:\n  train: {command: [a]}\n"
            "  eval: {command: [b]}\n  train: {command: [c]}\n",
            5,
            "jobs.train",
            3,
        ),
        ("version: 1\nhosts:\n  n1: {gpus: 1, gpus: 2}\n", 3, "hosts.n1.gpus", 3),
    ],
)
def test_duplicate_keys_are_refused(text: str, line: int, field: str, first: int) -> None:
    error = only_error(text)
    key = field.rsplit(".", 1)[-1]
    assert (error.line, error.field) == (line, field)
    assert error.reason == f"duplicate key {key!r} (first at line {first})"


@pytest.mark.parametrize("text", ["", "\n\n", "# nothing yet\n", "---\n", "~\n"])
def test_empty_file(text: str) -> None:
    with pytest.raises(PolicyError) as info:
        load_policy(text, "policy.yaml")
    assert str(info.value) == "policy.yaml:1: the policy is empty (it needs at least 'version: 1')"


@pytest.mark.parametrize(
    ("text", "got"),
    [("- version: 1\n", "a list"), ("version 1\n", "a single value"), ("3\n", "a single value")],
)
def test_top_level_must_be_a_mapping(text: str, got: str) -> None:
    error = only_error(text)
    assert error.line == 1
    assert error.reason == (
        f"the top level must be a mapping of sections (version, hosts, jobs, ...), got {got}"
    )


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("signal:HUP", "unknown signal 'HUP' (did you mean 'signal:SIGHUP'?)"),
        ("signal:SIGBOGUS", "unknown signal 'SIGBOGUS' (e.g. signal:SIGHUP, signal:SIGUSR1)"),
        ("signal:SIGKILL", "SIGKILL cannot be handled by a worker; use restart"),
        (
            "restrat",
            "expected restart, none or signal:<SIGNAME>, got a string ('restrat') "
            "(did you mean 'restart'?)",
        ),
        (
            "yes",
            "yes is ambiguous (YAML 1.1 reads it as true, YAML 1.2 as text); "
            "quote it ('yes') if you mean the text",
        ),
    ],
)
def test_on_change_is_restart_none_or_a_known_signal(value: str, reason: str) -> None:
    error = only_error(f"version: 1\njobs:\n  a:\n    command: [x]\n    on_change: {value}\n")
    assert (error.line, error.field, error.reason) == (5, "jobs.a.on_change", reason)


def test_enum_suggests_the_closest_choice() -> None:
    error = only_error("version: 1\nvisible_devices: uuids\n")
    assert (error.line, error.field) == (2, "visible_devices")
    assert (
        error.reason == "expected one of uuid, index, got a string ('uuids') (did you mean 'uuid'?)"
    )


def test_env_cannot_override_what_the_agent_sets() -> None:
    errors = errors_of(
        """
        version: 1
        jobs:
          a:
            command: [x]
            env:
              CUDA_VISIBLE_DEVICES: "0"
              ALLOCATOR_DEVICE: cpu
              1BAD: x
        """
    )
    found = {(e.line, e.field, e.reason) for e in errors}
    assert found == {
        (
            6,
            "jobs.a.env.CUDA_VISIBLE_DEVICES",
            "CUDA_VISIBLE_DEVICES is set by the agent from the assignment; a job cannot set it",
        ),
        (
            7,
            "jobs.a.env.ALLOCATOR_DEVICE",
            "ALLOCATOR_DEVICE is set by the agent from the assignment; a job cannot set it",
        ),
        (
            8,
            "jobs.a.env.1BAD",
            "'1BAD' is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)",
        ),
    }


def test_restart_backoff_cap_below_the_first_delay() -> None:
    error = only_error(
        """
        version: 1
        jobs:
          a:
            command: [x]
            restart_backoff_seconds: 5
            restart_backoff_max_seconds: 2
        """
    )
    assert (error.line, error.field) == (6, "jobs.a.restart_backoff_max_seconds")
    assert error.reason == "restart_backoff_max_seconds (2) must be >= restart_backoff_seconds (5)"


def test_numbers_must_be_finite_and_health_interval_positive() -> None:
    errors = errors_of(
        """
        version: 1
        jobs:
          a: {command: [x], grace_seconds: .inf}
        health:
          interval_seconds: 0
        """
    )
    found = {(e.line, e.field, e.reason) for e in errors}
    assert found == {
        (3, "jobs.a.grace_seconds", "must be a finite number, got .inf"),
        (5, "health.interval_seconds", "must be >= 0.1, got 0"),
    }


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        (
            "version: 1\njobs: !!python/object:os.system {}\n",
            "jobs",
            "unsupported tag 'tag:yaml.org,2002:python/object:os.system' on a mapping",
        ),
        (
            "version: 1\njobs:\n  a: {command: [!!python/name:os.system x]}\n",
            "jobs.a.command[0]",
            "could not determine a constructor for the tag "
            "'tag:yaml.org,2002:python/name:os.system'",
        ),
        (
            "version: 1\nhosts: !!set {a}\n",
            "hosts",
            "unsupported tag 'tag:yaml.org,2002:set' on a mapping",
        ),
    ],
)
def test_unsafe_or_unsupported_tags_are_refused(text: str, field: str, reason: str) -> None:
    error = only_error(text)
    assert (error.field, error.reason) == (field, reason)


def test_mapping_keys_must_be_strings() -> None:
    error = only_error("version: 1\njobs:\n  ? [a, b]\n  : {command: [x]}\n")
    assert (error.line, error.field) == (3, "jobs")
    assert error.reason == "mapping keys must be strings, got a list"


def test_many_problems_are_all_reported_first_one_in_the_message() -> None:
    with pytest.raises(PolicyError) as info:
        load_policy(
            textwrap.dedent(
                """\
                version: 1
                hosts:
                  node1: {gpus: 4, pool: nope}
                jobs:
                  train: {command: [x], fallback: cpu-9}
                  eval: {command: [y], workers: many}
                """
            ),
            "policy.yaml",
        )
    error = info.value
    assert [(e.line, e.field) for e in error.errors] == [
        (3, "hosts.node1.pool"),
        (5, "jobs.train.fallback"),
        (6, "jobs.eval.workers"),
    ]
    assert (
        str(error)
        == "policy.yaml:3: hosts.node1.pool: unknown pool 'nope' (defined: none) (and 2 more)"
    )
    assert (error.file, error.line, error.field) == ("policy.yaml", 3, "hosts.node1.pool")
    assert error.errors[2].to_dict() == {
        "file": "policy.yaml",
        "line": 6,
        "field": "jobs.eval.workers",
        "message": "expected one of single, per-gpu, torchrun, got a string ('many')",
        "error": "policy.yaml:6: jobs.eval.workers: "
        "expected one of single, per-gpu, torchrun, got a string ('many')",
    }


def test_a_single_error_lists_itself() -> None:
    error = only_error("version: 3\n")
    assert error.errors == (error,)


def test_cross_reference_errors_point_at_the_written_item_after_skipped_ones() -> None:
    errors = errors_of(
        """
        version: 1
        hosts:
          node1: {gpus: 2}
        pools:
          default:
            hosts:
              - node1
              - node1
              - node9
        reservations:
          - name: r
            for: [x]
            host: node1
            gpus:
              - 1
              - 1
              - 2
        """
    )
    found = {(e.line, e.field, e.reason) for e in errors}
    assert found == {
        (
            8,
            "pools.default.hosts[1]",
            "host 'node1' is listed twice (first at pools.default.hosts[0])",
        ),
        (9, "pools.default.hosts[2]", "unknown host 'node9' (declared: node1)"),
        (16, "reservations[0].gpus[1]", "GPU 1 is listed twice (first at reservations[0].gpus[0])"),
        (17, "reservations[0].gpus[2]", "GPU 2 is not on host 'node1', which has 2 GPUs (0-1)"),
    }


@pytest.mark.parametrize(
    "name", ["ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK", "ZE_FLAT_DEVICE_HIERARCHY"]
)
def test_every_vendor_s_device_variables_are_reserved_from_a_job_s_env(name: str) -> None:
    # ZE_FLAT_DEVICE_HIERARCHY=FLAT in a job's env would renumber the tiles the
    # agent's ZE_AFFINITY_MASK names: refused, as the filters are.
    error = only_error(
        f"""
        version: 1
        jobs:
          a:
            command: [x]
            env:
              {name}: "0"
        """
    )
    assert error.reason == f"{name} is set by the agent from the assignment; a job cannot set it"
