"""The policy split into shares, and one host's policy put back together from two of them."""

from __future__ import annotations

import msgspec
import pytest

from allocator.errors import BadRecord
from allocator.policy import load_policy
from allocator.policy.shares import (
    assemble,
    decode_common,
    decode_host_part,
    fleet_size,
    share_record,
    shares_agree,
    split_policy,
)
from allocator.records.shares import PolicyShare
from allocator.util.digest import sha256_hex

POLICY = """
version: 1
visible_devices: index
hosts:
  a: {gpus: 4, pool: p}
  b: {gpus: 2}
  c: {gpus: 8, vendor: amd}
  "n[01-40]": {gpus: 8}
pools:
  p: {max_gpus_per_job: 4, sharing: {mode: time-slice, slots: 2}, idle: {after: 60s}}
  q: {hosts: [b], vendor: nvidia}
reservations:
  - {name: r, host: a, gpus: [3], for: ["eval-*"]}
jobs:
  train: {command: [x], fallback: cpu}
  eval-1: {command: [y], idle: {action: none}}
fallback:
  cpu: {action: cpu, threads: 2}
quotas:
  - {who: "user:ann", gpus: 4, pools: [p]}
history: {entries_per_host: 50}  # else its default follows the number of hosts
"""
SHA = "a" * 64


def test_a_hosts_policy_answers_every_question_about_it_as_the_whole_one_does() -> None:
    whole = load_policy(POLICY)
    shares = split_policy(whole)
    (_, common) = decode_common(share_record(shares.common, SHA), "/k") or pytest.fail("format")
    for host in ("a", "b", "c", "n07", "elsewhere"):
        raw = shares.hosts.get(host)
        part = None
        if raw is not None:
            decoded = decode_host_part(share_record(raw, SHA), "/k", host)
            part = decoded[1] if decoded else pytest.fail("format")
        mine = assemble(common, part, host)
        assert mine.hosts.keys() <= {host}
        assert mine.hosts.get(host) == whole.hosts.get(host)
        assert mine.pool_of(host) == _without_other_hosts(whole.pool_of(host), host)
        assert mine.vendor_of(host) == whole.vendor_of(host)
        assert mine.reservations == tuple(r for r in whole.reservations if r.host == host)
        for job in whole.jobs:
            assert mine.idle_rule(job, host) == whole.idle_rule(job, host)
            assert mine.fallback_for(job) == whole.fallback_for(job)
        assert (mine.jobs, mine.quotas, mine.visible_devices) == (
            whole.jobs,
            whole.quotas,
            whole.visible_devices,
        )


def _without_other_hosts(pool: object, host: str) -> object:
    if pool is None:
        return None
    return msgspec.structs.replace(pool, hosts=(host,) if host in pool.hosts else ())  # type: ignore[type-var,attr-defined]


def test_the_common_share_does_not_grow_with_the_fleet_and_a_host_share_is_small() -> None:
    small = split_policy(load_policy(POLICY))
    big = split_policy(load_policy(POLICY.replace("n[01-40]", "n[00001-12500]")))
    # Only the fleet's size, rounded, tells them apart (what agents pace themselves by).
    assert (small.common.fleet_hosts, big.common.fleet_hosts) == (43, 13_000)
    unsized = msgspec.structs.replace(big.common, fleet_hosts=small.common.fleet_hosts)
    assert unsized == small.common
    assert len(share_record(big.common, SHA)) - len(share_record(small.common, SHA)) < 8
    assert len(big.hosts) == len(small.hosts) - 40 + 12_500
    assert max(len(share_record(part, SHA)) for part in big.hosts.values()) < 512


def test_a_one_host_change_changes_that_hosts_share_only() -> None:
    before = split_policy(load_policy(POLICY))
    after = split_policy(load_policy(POLICY.replace("c: {gpus: 8,", "c: {gpus: 6,")))
    assert after.common == before.common
    assert {h for h in after.hosts if after.hosts[h] != before.hosts.get(h)} == {"c"}


def test_a_share_that_is_not_what_it_says_is_a_bad_record() -> None:
    shares = split_policy(load_policy(POLICY))
    record = msgspec.json.decode(share_record(shares.hosts["a"], SHA), type=PolicyShare)
    tampered = msgspec.structs.replace(record, body=msgspec.Raw(b'{"name":"a","pool":"q"}'))
    with pytest.raises(BadRecord, match="sha256"):
        decode_host_part(tampered.to_json(), "/k", "a")
    with pytest.raises(BadRecord, match="not 'b'"):
        decode_host_part(share_record(shares.hosts["a"], SHA), "/k", "b")
    with pytest.raises(BadRecord):
        decode_common(b"garbage", "/k")
    wrong = msgspec.structs.replace(record, body=msgspec.Raw(b"7"), sha256=sha256_hex(b"7"))
    with pytest.raises(BadRecord, match="not a valid host share"):
        decode_host_part(wrong.to_json(), "/k", "a")


def test_a_host_share_that_names_a_pool_the_common_share_lacks_is_refused() -> None:
    whole = load_policy(POLICY)
    shares = split_policy(whole)
    decoded = decode_host_part(share_record(shares.hosts["a"], SHA), "/k", "a")
    assert decoded is not None
    (_, common) = decode_common(share_record(shares.common, SHA), "/k") or pytest.fail("format")
    with pytest.raises(BadRecord, match="pool 'p'"):
        assemble(msgspec.structs.replace(common, pools={}), decoded[1], "a")


def _share(policy_sha: str, *, in_txn: bool = False) -> PolicyShare:
    return PolicyShare(policy_sha, sha256_hex(b"{}"), "f", msgspec.Raw(b"{}"), in_txn)


@pytest.mark.parametrize(
    ("host", "host_revision", "agree"),
    [
        (None, 0, True),  # no share: the host is not in the policy
        (_share("1" * 64), 20, True),  # written by the common share's apply
        (_share("2" * 64), 5, True),  # written before it, left unchanged since
        (_share("2" * 64, in_txn=True), 30, True),  # written with its policy, atomically
        (_share("2" * 64), 30, False),  # an apply still writing (or that stopped): wait
    ],
)
def test_a_host_share_agrees_with_the_common_share_only_when_their_apply_is_done(
    host: PolicyShare | None, host_revision: int, agree: bool
) -> None:
    assert shares_agree(_share("1" * 64), 10, host, host_revision) is agree


def test_a_host_more_or_less_leaves_a_large_fleets_common_share_as_it_was() -> None:
    fleet = POLICY.replace("n[01-40]", "n[00001-12500]")
    grown = split_policy(load_policy(fleet.replace("n[00001-12500]", "n[00001-12501]")))
    assert grown.common == split_policy(load_policy(fleet)).common


@pytest.mark.parametrize(
    ("hosts", "size"), [(0, 0), (7, 7), (43, 43), (99, 99), (101, 110), (12_345, 13_000)]
)
def test_the_fleets_size_is_rounded_up_to_two_significant_digits(hosts: int, size: int) -> None:
    assert fleet_size(hosts) == size
