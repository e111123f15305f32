"""One job across hosts never mixes GPU vendors unless it says so."""

from __future__ import annotations

import pytest

from allocator.errors import RequestError
from allocator.placement.vendors import check_one_vendor
from allocator.policy.model import Host, Job, Policy, Pool


def policy(mix: bool = False) -> Policy:
    return Policy(
        version=1,
        hosts={
            "a": Host("a", 2, vendor="nvidia"),
            "b": Host("b", 2, pool="mi"),
            "c": Host("c", 2),
        },
        pools={"mi": Pool("mi", vendor="amd")},
        jobs={"dist": Job("dist", ("python",), mix_vendors=mix)},
    )


def test_hosts_of_two_vendors_are_refused() -> None:
    with pytest.raises(RequestError, match=r"a \(nvidia\), b \(amd\) have GPUs of different"):
        check_one_vendor(policy(), "dist", {"a": None, "b": None})  # the policy's word (pool)


def test_the_agents_finding_wins_over_the_policy() -> None:
    check_one_vendor(policy(), "dist", {"a": "amd", "b": None})
    with pytest.raises(RequestError, match=r"c \(intel\)"):
        check_one_vendor(policy(), "dist", {"a": None, "c": "intel"})


def test_unknown_vendors_and_a_job_that_allows_mixing_pass() -> None:
    check_one_vendor(policy(), "dist", {"a": None, "c": None})
    check_one_vendor(policy(mix=True), "dist", {"a": None, "b": None})
