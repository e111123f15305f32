"""A 25,000-host fleet applies on etcd with its default limits; past the bound, nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from allocator.policy.spec_bounds import MAX_HOSTS
from tests.e2e.conftest import clean_env, run_cli

#: 200,000 GPUs, the largest training clusters.
FLEET_HOSTS = 25_000


def _fleet(hosts: int) -> str:
    # node00000 .. : one range, as an operator writes a fleet this size
    return f"version: 1\nhosts:\n  node[00000-{hosts - 1:05d}]: {{gpus: 8}}\n"


def test_a_fleet_of_25000_hosts_applies_on_etcd_with_its_default_limits(
    etcd_server: Any, prefix: str, tmp_path: Path
) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(_fleet(FLEET_HOSTS))
    env = clean_env(ALLOCATOR_STORE=etcd_server.url, ALLOCATOR_PREFIX=prefix)

    applied = run_cli(["policy", "apply", str(path)], env, timeout=120)
    assert applied.code == 0, applied.err
    shown = run_cli(["status", "host=node24999", "-o", "json"], env)
    assert shown.code == 0, shown.err
    (host,) = json.loads(shown.out)["hosts"]
    assert (host["host"], len(host["gpus"])) == ("node24999", 8)


def test_a_fleet_over_the_bound_is_refused_and_nothing_is_written(
    etcd_server: Any, prefix: str, tmp_path: Path
) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(_fleet(MAX_HOSTS + 1))
    env = clean_env(ALLOCATOR_STORE=etcd_server.url, ALLOCATOR_PREFIX=prefix)

    refused = run_cli(["policy", "apply", str(path)], env)

    assert refused.code == 2, refused.err
    assert f"at most {MAX_HOSTS:,}" in refused.err
    assert etcd_server.etcdctl("get", prefix, "--prefix", "--keys-only").strip() == ""
