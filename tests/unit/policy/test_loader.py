"""Loading valid policies: the example, defaults, normalisation, files, round trips."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import pytest

import allocator.policy as policy_pkg
from allocator.errors import EXIT_INVALID, PolicyError
from allocator.policy import (
    DEFAULT_IGNORED_XIDS,
    FallbackRule,
    HealthSettings,
    Host,
    IdleRule,
    Job,
    Policy,
    Pool,
    Reservation,
    Sharing,
    load_policy,
    load_policy_file,
    policy_sha256,
    policy_to_dict,
)
from allocator.policy.yamlspec.document import dump_yaml

EXAMPLE = Path(__file__).resolve().parents[3] / "config" / "policy.example.yaml"


def test_example_loads_to_the_expected_objects() -> None:
    policy = load_policy_file(EXAMPLE)
    assert policy == Policy(
        version=1,
        hosts={
            "node1": Host(name="node1", gpus=4, pool="default"),
            "node2": Host(name="node2", gpus=8, pool="a100"),
            "node3": Host(name="node3", gpus=2, pool="inference"),
        },
        pools={
            "default": Pool(
                name="default",
                hosts=("node1",),
                sharing=Sharing(),
                idle=IdleRule(after_seconds=7200.0, action="warn"),
            ),
            "a100": Pool(name="a100", hosts=("node2",), max_gpus_per_job=4),
            "inference": Pool(name="inference", hosts=("node3",), sharing=Sharing("mps", 4)),
        },
        reservations=(
            Reservation(
                name="nightly-eval",
                host="node1",
                gpus=(3,),
                for_jobs=("eval-*",),
                until=datetime(2030, 1, 1, tzinfo=UTC),
            ),
        ),
        jobs={
            "train": Job(
                name="train",
                command=("python", "-m", "train"),
                env={"PYTHONUNBUFFERED": "1"},
                grace_seconds=30.0,
                fallback="cpu-8",
                exclusive=True,
            ),
            "eval-nightly": Job(
                name="eval-nightly",
                command=("python", "-m", "eval", "--suite", "nightly"),
                workers="per-gpu",
                on_change="signal:SIGHUP",
                fallback="wait",
            ),
            "serve": Job(
                name="serve",
                command=("python", "-m", "serve"),
                workers="per-gpu",
                fallback="wait",
            ),
        },
        fallback={
            "cpu-8": FallbackRule(name="cpu-8", action="cpu", threads=8),
            "wait": FallbackRule(name="wait", action="wait"),
        },
        visible_devices="uuid",
        health=HealthSettings(ignored_xids=DEFAULT_IGNORED_XIDS, interval_seconds=5.0),
    )
    assert policy.fallback_for("train") == FallbackRule(name="cpu-8", action="cpu", threads=8)
    assert policy.pool_of("node2") == policy.pools["a100"]
    nightly = policy.reservations[0]
    assert nightly.admits("eval-nightly") and not nightly.admits("train")
    assert nightly.active(datetime(2029, 12, 31, tzinfo=UTC))


def test_minimal_policy_gets_the_model_defaults() -> None:
    policy = load_policy("version: 1\n")
    assert policy == Policy(version=1)
    assert policy.visible_devices == "uuid"
    assert policy.health.ignored_xids == DEFAULT_IGNORED_XIDS


def test_job_defaults_and_types() -> None:
    policy = load_policy("version: 1\njobs:\n  a: {command: [run, '0.10'], grace_seconds: 3}\n")
    job = policy.jobs["a"]
    assert job == Job(name="a", command=("run", "0.10"), grace_seconds=3.0)
    assert isinstance(job.grace_seconds, float)
    assert isinstance(job.command, tuple)


def test_empty_sections_are_allowed() -> None:
    text = "version: 1\nhosts:\npools: ~\nreservations:\njobs:\nfallback: null\n"
    assert load_policy(text) == Policy(version=1)


def test_null_optional_field_means_its_default() -> None:
    policy = load_policy("version: 1\njobs:\n  a: {command: [x], cwd: ~, fallback: null}\n")
    assert policy.jobs["a"].cwd is None
    assert policy.jobs["a"].fallback is None


def test_null_for_a_field_with_a_real_default_is_an_error() -> None:
    with pytest.raises(PolicyError) as info:
        load_policy("version: 1\njobs:\n  a: {command: [x], grace_seconds: ~}\n", "p.yaml")
    assert str(info.value) == "p.yaml:3: jobs.a.grace_seconds: expected a number, got null"


def test_pool_membership_is_normalised_both_ways() -> None:
    policy = load_policy(
        textwrap.dedent(
            """\
            version: 1
            hosts:
              a: {gpus: 1, pool: gpu}
              b: {gpus: 1}
              c: {gpus: 1, pool: gpu}
              d: {gpus: 1}
            pools:
              gpu: {hosts: [b, c], sharing: shared}
            """
        )
    )
    assert policy.pools["gpu"].hosts == ("b", "c", "a")
    assert {name: host.pool for name, host in policy.hosts.items()} == {
        "a": "gpu",
        "b": "gpu",
        "c": "gpu",
        "d": None,
    }
    assert policy.pool_of("d") is None


def test_timestamps_from_yaml_or_strings_become_utc() -> None:
    policy = load_policy(
        textwrap.dedent(
            """\
            version: 1
            hosts: {n: {gpus: 2}}
            reservations:
              - {name: a, host: n, gpus: [0], for: [x], start: 2027-01-01T02:00:00+02:00}
              - {name: b, host: n, gpus: [1], for: [x], until: '2027-06-01T00:00:00Z'}
            """
        )
    )
    first, second = policy.reservations
    assert first.start == datetime(2027, 1, 1, tzinfo=UTC)
    assert first.start is not None and first.start.utcoffset() is not None
    assert first.start.tzinfo == UTC
    assert second.until == datetime(2027, 6, 1, tzinfo=UTC)


def test_on_change_signals() -> None:
    text = (
        "version: 1\njobs:\n"
        "  a: {command: [x], on_change: signal:SIGUSR1}\n"
        "  b: {command: [x], on_change: none}\n"
    )
    policy = load_policy(text)
    assert policy.jobs["a"].on_change == "signal:SIGUSR1"
    assert policy.jobs["b"].on_change == "none"


def test_yaml_anchors_and_merge_keys() -> None:
    policy = load_policy(
        textwrap.dedent(
            """\
            version: 1
            jobs:
              base: &base
                command: [python, -m, worker]
                max_restarts: 2
                env: {A: "1"}
              other:
                <<: *base
                max_restarts: 7
            """
        )
    )
    assert policy.jobs["other"] == Job(
        name="other", command=("python", "-m", "worker"), max_restarts=7, env={"A": "1"}
    )


def test_names_are_taken_as_written() -> None:
    # a key like 0001 or yes is a name, not a number or boolean
    policy = load_policy("version: 1\nhosts:\n  0001: {gpus: 1}\n  yes: {gpus: 2}\n")
    assert set(policy.hosts) == {"0001", "yes"}


def test_example_round_trips_through_policy_to_dict() -> None:
    policy = load_policy_file(EXAMPLE)
    data = policy_to_dict(policy)
    assert json.loads(json.dumps(data)) == data
    assert load_policy(dump_yaml(data)) == policy
    assert load_policy(json.dumps(data, indent=2, sort_keys=True)) == policy
    assert policy_to_dict(load_policy(json.dumps(data))) == data


def test_policy_to_dict_spells_out_every_field() -> None:
    data = policy_to_dict(load_policy_file(EXAMPLE))
    assert data["reservations"][0] == {
        "name": "nightly-eval",
        "host": "node1",
        "gpus": [3],
        "for": ["eval-*"],
        "who": [],
        "start": None,
        "until": "2030-01-01T00:00:00Z",
    }
    assert data["fallback"]["wait"] == {"action": "wait", "threads": None}
    assert data["health"] == {
        "ignored_xids": [13, 31, 43, 45, 68, 109],
        "interval_seconds": 5.0,
        "recovery_probe": None,
        "recovery_probe_timeout_seconds": 60.0,
        "hold_down_seconds": 10.0,
        "hold_down_max_seconds": 300.0,
        "flap_restart_limit": 4,
    }
    assert data["jobs"]["eval-nightly"]["env"] == {}


def test_policy_to_dict_is_the_same_for_equivalent_spellings() -> None:
    by_host = "version: 1\nhosts: {n: {gpus: 1, pool: p}}\npools: {p: {}}\n"
    by_pool = "version: 1\nhosts: {n: {gpus: 1}}\npools: {p: {hosts: [n]}}\n"
    assert policy_to_dict(load_policy(by_host)) == policy_to_dict(load_policy(by_pool))


def test_load_policy_file_names_a_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(PolicyError) as info:
        load_policy_file(missing)
    assert info.value.exit_code == EXIT_INVALID
    assert str(info.value) == f"{missing}: cannot read policy file: No such file or directory"


def test_load_policy_file_refuses_a_directory(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as info:
        load_policy_file(tmp_path)
    assert str(info.value).startswith(f"{tmp_path}: cannot read policy file: ")


def test_load_policy_file_refuses_non_utf8(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_bytes(b"version: 1\n# caf\xe9\n")
    with pytest.raises(PolicyError) as info:
        load_policy_file(path)
    assert str(info.value) == f"{path}:2: not UTF-8 text (byte 0xe9 at offset 16)"


def test_load_policy_file_reports_errors_under_its_path(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("\ufeffversion: 1\nhosts:\n  n: {gpus: x}\n", encoding="utf-8")
    with pytest.raises(PolicyError) as info:
        load_policy_file(str(path))
    assert str(info.value) == (f"{path}:3: hosts.n.gpus: expected an integer, got a string ('x')")


def test_policy_sha256_is_the_sha256_of_the_utf8_text() -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    assert policy_sha256(text) == hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert policy_sha256(text) != policy_sha256(text + "\n")


def test_public_api() -> None:
    assert set(policy_pkg.__all__) >= {
        "load_policy",
        "load_policy_file",
        "policy_json_schema",
        "policy_to_dict",
        "policy_sha256",
        "Policy",
        "Host",
        "Pool",
        "Reservation",
        "Job",
        "FallbackRule",
        "HealthSettings",
    }
    for name in policy_pkg.__all__:
        assert getattr(policy_pkg, name) is not None


def test_importing_the_package_does_not_import_yaml() -> None:
    code = (
        "import sys, allocator.policy as p\n"
        "assert 'yaml' not in sys.modules, 'yaml imported'\n"
        "p.policy_json_schema()\n"
        "assert 'yaml' not in sys.modules, 'yaml imported by the schema'\n"
        "p.load_policy('version: 1')\n"
        "assert 'yaml' in sys.modules\n"
        "assert not {'jsonschema', 'torch'} & set(sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_unquoted_exponent_numbers_are_numbers() -> None:
    # YAML 1.1 reads 1e3 as text; YAML 1.2, JSON and schema tools read a number
    policy = load_policy("version: 1\njobs:\n  a: {command: [x], grace_seconds: 1e1}\n")
    assert policy.jobs["a"].grace_seconds == 10.0
    with pytest.raises(PolicyError) as info:
        load_policy("version: 1\njobs:\n  a: {command: [x], grace_seconds: '1e1'}\n")
    assert info.value.reason == "expected a number, got a string ('1e1')"
