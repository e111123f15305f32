"""Hosts declared in groups: ``node[0000-12499]: {gpus: 8, pool: a100}`` and its exceptions."""

from __future__ import annotations

import json
import textwrap
import time

import pytest

from allocator.errors import PolicyError
from allocator.policy import load_policy, policy_json_schema
from allocator.policy.host_ranges import expand_hosts, pattern_count
from allocator.policy.model import Host


def load(text: str):  # type: ignore[no-untyped-def]
    return load_policy(textwrap.dedent(text).lstrip("\n"), "policy.yaml")


def errors_of(text: str) -> tuple[PolicyError, ...]:
    with pytest.raises(PolicyError) as info:
        load(text)
    return info.value.errors


def test_a_range_is_zero_padded_as_written_and_runs_past_its_width() -> None:
    names = expand_hosts("node[0998-1001]", 100)
    assert names == ["node0998", "node0999", "node1000", "node1001"]
    assert expand_hosts("n[8-11]", 100) == ["n8", "n9", "n10", "n11"]
    assert expand_hosts("n[0098-0099,10000]", 100) == ["n0098", "n0099", "n10000"]
    assert expand_hosts("r[1-2]-g[01-02]", 100) == ["r1-g01", "r1-g02", "r2-g01", "r2-g02"]
    assert pattern_count("node[0000-12499]") == 12_500


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("n[5-1]", "runs backwards"),
        ("n[1-]", "brackets hold numbers"),
        ("n[a-b]", "brackets hold numbers"),
        ("n[0-99999999]", "names 100,000,000 hosts; at most 100"),
        ("n[1-3,2]", "names some hosts twice"),
        ("-[1-2]", "is not allowed"),
        ("x" * 62 + "[1-10]", "characters long"),
    ],
)
def test_an_unusable_pattern_says_why(key: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        expand_hosts(key, 100)


def test_a_range_declares_every_host_and_an_explicit_entry_is_its_exception() -> None:
    policy = load(
        """
        version: 1
        pools: {a100: {}, spare: {}}
        hosts:
          node[0000-0099]: {gpus: 8, pool: a100}
          node0042: {gpus: 4, pool: spare}
        """
    )
    assert len(policy.hosts) == 100
    assert policy.hosts["node0007"] == Host("node0007", 8, "a100")
    assert policy.hosts["node0042"] == Host("node0042", 4, "spare")
    assert len(policy.pools["a100"].hosts) == 99
    assert policy.pools["spare"].hosts == ("node0042",)
    assert policy.pool_of("node0099") == policy.pools["a100"]


def test_a_pool_may_list_its_hosts_by_pattern() -> None:
    policy = load(
        """
        version: 1
        hosts:
          gpu-[1-8]: {gpus: 2}
        pools:
          small: {hosts: ["gpu-[1-4]"]}
          big: {hosts: ["gpu-[5-6]", gpu-7]}
        """
    )
    assert policy.pools["small"].hosts == ("gpu-1", "gpu-2", "gpu-3", "gpu-4")
    assert policy.hosts["gpu-6"].pool == "big"
    assert policy.hosts["gpu-8"].pool is None


def test_errors_about_a_ranged_host_name_the_host_and_the_range_line() -> None:
    errors = errors_of(
        """
        version: 1
        pools: {a: {hosts: ["n[1-3]"]}, b: {}}
        hosts:
          n[1-4]: {gpus: 2, pool: b}
        reservations:
          - {name: r, host: n3, gpus: [5], for: [x]}
        """
    )
    shown = sorted(str(error) for error in errors)
    assert "policy.yaml:4: hosts.n2.pool: host 'n2' says pool 'b' but pool 'a' lists it" in (
        "\n".join(shown)
    )
    reservation = [e for e in errors if e.field and e.field.startswith("reservations")]
    assert reservation and "n3" in str(reservation[0]) and reservation[0].line == 6


def test_two_ranges_covering_one_host_is_an_error_naming_it() -> None:
    errors = errors_of(
        """
        version: 1
        hosts:
          n[1-4]: {gpus: 2}
          n[4-6]: {gpus: 2}
        """
    )
    assert len(errors) == 1
    assert errors[0].line == 4
    assert "host 'n4' is also in hosts.n[1-4] (line 3)" in str(errors[0])


def test_a_pool_listing_a_host_twice_through_patterns_names_it() -> None:
    errors = errors_of(
        """
        version: 1
        hosts: {"n[1-4]": {gpus: 2}}
        pools: {a: {hosts: ["n[1-3]", "n[3-4]"]}}
        """
    )
    assert "host 'n3' is listed twice (first at pools.a.hosts[0])" in str(errors[0])
    assert errors[0].line == 3


def test_the_schema_accepts_range_keys() -> None:
    schema = policy_json_schema()
    hosts = schema["properties"]["hosts"]["anyOf"][0]
    pattern = hosts["propertyNames"]["pattern"]
    import re

    assert re.match(pattern, "node[0000-12499]")
    assert re.match(pattern, "rack[1-2]-n[01-16,20]")
    assert re.match(pattern, "plain-host")
    assert not re.match(pattern, "n[a-b]")
    json.dumps(schema)


def _ranged(hosts: int) -> str:
    last = hosts - 1
    return (
        "version: 1\npools: {a100: {}}\nhosts:\n"
        f"  node[00000-{last:05d}]: {{gpus: 8, pool: a100}}\n"
    )


def test_a_ranged_fleet_of_12500_hosts_loads_without_a_quadratic_step() -> None:
    """About 0.1 s here; a step quadratic in the hosts (a tuple searched per host) takes tens."""
    text = _ranged(12_500) + f"# {time.monotonic_ns()}\n"  # not the loader's cache
    start = time.perf_counter()
    policy = load_policy(text)
    assert time.perf_counter() - start < 5.0
    assert len(policy.hosts) == 12_500
    assert len(policy.pools["a100"].hosts) == 12_500


def test_ranges_naming_more_hosts_than_a_policy_may_have_stop_being_expanded() -> None:
    errors = errors_of(
        """
        version: 1
        hosts:
          a[00000-29999]: {gpus: 1}
          b[00000-29999]: {gpus: 1}
          c[00000-29999]: {gpus: 1}
        """
    )
    assert [(e.line, e.reason) for e in errors] == [(5, "declares more than 32,768 hosts")]
