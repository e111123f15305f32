"""Whole CLI processes against the store's own tools, in the same run.

Rows: ``allocator set`` on etcd vs ``etcdctl put``; ``allocator get job=J``
(no ``host=``) on a 1,000-host etcd vs ``etcdctl get`` of one key;
``allocator set`` on SQLite vs ``python -c pass``; ``allocator status -o
json`` of 1,000 hosts x 8 GPUs vs ``etcdctl get --prefix -w json`` of the
same keys; ``allocator policy validate`` of a 1,000-host policy vs PyYAML
loading the same file; ``allocator run count=1 -- python -c pass`` on SQLite
(take the GPUs, run the command, release them) vs ``python -c pass`` itself.
Each pair runs interleaved, ``rounds`` times.

The console script hands a command to the user's command server once one
runs (:mod:`allocator.resident`), so ``set``, ``get`` and ``run`` are also
measured in their own process (``ALLOCATOR_SERVER=0``): a first command, or
a server turned off (or, for ``run``, unlike its caller).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from allocator.store import open_store
from bench.common import (
    Row,
    allocator_cli,
    byte_compile,
    clean_env,
    command_server_ready,
    interleaved,
    ratio_row,
    timed_run,
)
from bench.fleet import fleet_policy, job_name, load_fleet
from tests.support.etcd_server import EtcdServer

__all__ = ["main", "rows", "set_moves"]

POLICY = Path(__file__).resolve().parents[1] / "config" / "policy.example.yaml"


def _etcdctl(server: EtcdServer, *args: str) -> list[str]:
    return ["etcdctl", "--endpoints", server.endpoint, *args]


def set_moves(env: dict[str, str]) -> Callable[[], float]:
    """Times one ``allocator set``, moving a job between GPUs 0 and 1 (each a real change)."""
    commands = [allocator_cli("set", "job=train", f"gpus={g}", "host=node1") for g in (0, 1)]
    turn = [0]

    def run() -> float:
        turn[0] += 1
        return timed_run(commands[turn[0] % 2], env)

    return run


def rows(rounds: int, hosts: int, work: Path, warmup: int = 1) -> list[Row]:
    """Measure every CLI row (``hosts``: the size of the simulated fleet)."""
    byte_compile()
    server = EtcdServer(work / "etcd-cli")
    server.start()
    try:
        return _measure(server, rounds, hosts, work, warmup)
    finally:
        server.stop()


def _measure(server: EtcdServer, rounds: int, hosts: int, work: Path, warmup: int) -> list[Row]:
    base = clean_env()
    ctl = clean_env(ETCDCTL_API="3")
    sqlite = clean_env(ALLOCATOR_STORE=f"sqlite://{work / 'cli.db'}")
    on_node1 = {**sqlite, "ALLOCATOR_HOST": "node1"}  # `run` takes GPUs of this machine only
    etcd = clean_env(ALLOCATOR_STORE=server.url)
    fleet = clean_env(ALLOCATOR_STORE=server.url, ALLOCATOR_PREFIX="/fleet")
    # The same commands run in their own process, as `python -m allocator` always does.
    etcd_here = {**etcd, "ALLOCATOR_SERVER": "0"}
    fleet_here = {**fleet, "ALLOCATOR_SERVER": "0"}
    for env in (sqlite, etcd):
        timed_run(allocator_cli("policy", "apply", str(POLICY)), env)
    store = open_store(server.url)
    try:
        load_fleet(store, "/fleet", hosts=hosts)
    finally:
        store.close()
    policy_file = work / "fleet-policy.yaml"
    policy_file.write_text(fleet_policy(hosts))
    command_server_ready(etcd)
    job = job_name(hosts // 2, 3)
    samples = interleaved(
        {
            "etcdctl put": lambda: timed_run(_etcdctl(server, "put", "/bench/k", "v"), ctl),
            "set etcd": set_moves(etcd),
            "etcdctl get": lambda: timed_run(_etcdctl(server, "get", f"/fleet/v1/jobs/{job}"), ctl),
            "get etcd": lambda: timed_run(allocator_cli("get", f"job={job}"), fleet),
            "set etcd here": set_moves(etcd_here),
            "get etcd here": lambda: timed_run(allocator_cli("get", f"job={job}"), fleet_here),
            "python -c pass": lambda: timed_run([sys.executable, "-c", "pass"], base),
            "set sqlite": set_moves(sqlite),
            "run sqlite": lambda: timed_run(
                allocator_cli("run", "host=node1", "count=1", "--", sys.executable, "-c", "pass"),
                on_node1,
            ),
            "run sqlite here": lambda: timed_run(
                allocator_cli("run", "host=node1", "count=1", "--", sys.executable, "-c", "pass"),
                {**on_node1, "ALLOCATOR_SERVER": "0"},
            ),
        },
        rounds,
        warmup,
    )
    heavy = interleaved(
        {
            "etcdctl get prefix": lambda: timed_run(
                _etcdctl(server, "get", "--prefix", "/fleet/v1/hosts/", "-w", "json"), ctl
            ),
            "status": lambda: timed_run(allocator_cli("status", "-o", "json"), fleet),
            "yaml": lambda: timed_run(
                [sys.executable, "-c", f"import yaml; yaml.safe_load(open({str(policy_file)!r}))"],
                base,
            ),
            "validate": lambda: timed_run(
                allocator_cli("policy", "validate", str(policy_file)), base
            ),
        },
        max(1, rounds // 3),
        warmup,
    )
    return [
        ratio_row("CLI set, etcd", samples["set etcd"], samples["etcdctl put"], most=4),
        ratio_row(
            f"CLI get, etcd, no host=, {hosts} hosts",
            samples["get etcd"],
            samples["etcdctl get"],
            most=4,
        ),
        ratio_row(
            "CLI set in its own process (ALLOCATOR_SERVER=0), etcd",
            samples["set etcd here"],
            samples["etcdctl put"],
            most=8,
            note="a first command, or a server turned off: the imports are paid each time",
        ),
        ratio_row(
            f"CLI get in its own process (ALLOCATOR_SERVER=0), etcd, {hosts} hosts",
            samples["get etcd here"],
            samples["etcdctl get"],
            most=8,
            note="a first command, or a server turned off: the imports are paid each time",
        ),
        ratio_row("CLI set, SQLite", samples["set sqlite"], samples["python -c pass"], most=3),
        ratio_row(
            "run -- python -c pass, SQLite",
            samples["run sqlite"],
            samples["python -c pass"],
            most=8,
            note="take, run the command, release: against starting the command directly",
        ),
        ratio_row(
            "run -- python -c pass in its own process (ALLOCATOR_SERVER=0), SQLite",
            samples["run sqlite here"],
            samples["python -c pass"],
            most=16,
            note="a first run, or a server turned off or unlike the caller (another cgroup, "
            "nice, CPUs...): the imports are paid each time",
        ),
        ratio_row(
            f"fleet status, {hosts} hosts x 8 GPUs",
            heavy["status"],
            heavy["etcdctl get prefix"],
            most=2.5,
        ),
        ratio_row(f"policy validate, {hosts} hosts", heavy["validate"], heavy["yaml"], most=3),
    ]


def main(argv: Sequence[str] | None = None) -> None:
    """Print the CLI rows."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--hosts", type=int, default=1000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        for row in rows(args.rounds, args.hosts, Path(tmp)):
            print(row.to_json())


if __name__ == "__main__":
    main()
