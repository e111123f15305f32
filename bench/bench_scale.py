"""The fleet at full size: quick commands and ``policy apply`` at 25,000 hosts next to 1,000.

Two simulated fleets (:mod:`bench.fleet`: 8 GPUs and 6 assignments a host,
agents and workers) on one etcd, each under its own prefix, with the same
policy written as a range (``node[0000-24999]: {gpus: 8}``), so the YAML is
the same size at both and its compiled form, at 25,000 hosts, is stored in
parts. Rows (each a ratio of the large fleet to the small, interleaved):

* ``set`` (a job moved between two free GPUs of one host), ``get job=J``
  and ``status host=H``: within 1.2x;
* ``policy apply`` changing one host's entry (an exception written under
  the range, its GPU count flipped between 8 and 7): within 3x;
* a first apply of the whole large fleet (no policy applied, every
  assignment checked) with default settings: it must succeed; its seconds;
* ``status -o json`` of the whole large fleet against ``etcdctl get
  --prefix -w json`` of the same keys: within 2x (and it must not fail);
* ``status --summary`` of the large fleet against its whole ``status -o
  json``: within 0.3x;
* ``allocator serve`` over a fleet of at most :data:`SERVED_HOSTS`
  (:mod:`bench.bench_serve`): its targets (memory above all) are stated
  for that size, and a third fleet is loaded for it when the large one is
  larger;
* what one apply costs an agent, and writes to the store
  (:mod:`bench.bench_shares`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from allocator.records.keys import KeyLayout
from allocator.store import open_store
from bench import bench_shares
from bench.bench_serve import serve_rows
from bench.common import (
    Row,
    allocator_cli,
    byte_compile,
    clean_env,
    interleaved,
    ratio_row,
    value_row,
)
from bench.common import timed_run as run_timed
from bench.fleet import host_name, job_name, load_fleet
from tests.support.etcd_server import EtcdServer

__all__ = ["SERVED_HOSTS", "ranged_policy", "rows"]

_JOBS = "jobs:\n  train:\n    command: [python, -m, train]\n"


def ranged_policy(hosts: int, exception_gpus: int | None = None) -> str:
    """The fleet's policy as one range, with host 42's entry written out when asked."""
    lines = ["version: 1", "hosts:", f"  node[0000-{hosts - 1:04d}]: {{gpus: 8}}"]
    if exception_gpus is not None:
        lines.append(f"  {host_name(min(42, hosts - 1))}: {{gpus: {exception_gpus}}}")
    return "\n".join(lines) + "\n" + _JOBS


#: The fleet the serve rows read: the issue states their targets (serve's
#: memory above all, which grows with the hosts) at 12,500 hosts.
SERVED_HOSTS = 12_500


def rows(args: argparse.Namespace, work: Path) -> list[Row]:
    """Measure the scale rows (``args.hosts`` small, ``args.large`` large, ``args.rounds``)."""
    byte_compile()
    server = EtcdServer(work / "etcd-scale")
    server.start()
    try:
        if args.smoke:  # each command once, no warm-up: the smoke proves the rows run
            return _measure(server, args.hosts, args.large, 1, work, warmup=0)
        return _measure(server, args.hosts, args.large, max(2, args.rounds // 2), work)
    finally:
        server.stop()


def _measure(
    server: EtcdServer, small: int, large: int, rounds: int, work: Path, warmup: int = 1
) -> list[Row]:
    served = min(large, SERVED_HOSTS)
    store = open_store(server.url)
    try:
        for size in sorted({small, large, served}):
            # written as a range: 25,000 hosts written out pass what a policy file may be
            load_fleet(store, f"/s{size}", hosts=size, policy=ranged_policy(size, None))
        store.delete(KeyLayout(f"/s{large}").policy)  # the large fleet's first apply, below
    finally:
        store.close()
    env = {
        size: clean_env(ALLOCATOR_STORE=server.url, ALLOCATOR_PREFIX=f"/s{size}")
        for size in (small, large)
    }
    files = {}
    for size in (small, large):
        for gpus in (None, 7):
            path = work / f"policy-{size}-{gpus}.yaml"
            path.write_text(ranged_policy(size, gpus))
            files[size, gpus] = path
    first = run_timed(allocator_cli("policy", "apply", str(files[large, None])), env[large])
    run_timed(allocator_cli("policy", "apply", str(files[small, None])), env[small])
    shares = bench_shares.rows(
        server.url, (small, large), env[large], (files[large, 7], files[large, None]), rounds
    )
    runs: dict[str, Callable[[], float]] = {}
    for size in (small, large):
        runs |= _commands(size, env[size], files)
    samples = interleaved(runs, rounds, warmup)
    whole_rounds = max(2, rounds // 2) if warmup else rounds
    whole = interleaved(_whole_fleet(server, large, env[large]), whole_rounds, warmup)
    serving = serve_rows(server, f"/s{served}", served, rounds, work)
    return [
        ratio_row(
            f"status -o json, {large:,} hosts vs etcdctl get --prefix -w json",
            whole["status"],
            whole["etcdctl"],
            most=2.0,
        ),
        ratio_row(
            f"status --summary vs whole status, {large:,} hosts",
            whole["summary"],
            whole["status"],
            most=0.3,
        ),
        *(
            ratio_row(
                f"{what}, {large:,} vs {small:,} hosts",
                samples[f"{what} {large}"],
                samples[f"{what} {small}"],
                most=most,
            )
            for what, most in (
                ("CLI set", 1.2),
                ("CLI get", 1.2),
                ("CLI status host=", 1.2),
                ("policy apply of a one-host change", 3.0),
            )
        ),
        value_row(f"first policy apply, {large:,} hosts", first, 60.0, "s"),
        *serving,
        *shares,
    ]


def _whole_fleet(
    server: EtcdServer, size: int, env: dict[str, str]
) -> dict[str, Callable[[], float]]:
    """The whole fleet read: etcdctl's, ``status -o json`` and ``status --summary``."""
    ctl = clean_env(ETCDCTL_API="3")
    hosts = KeyLayout(f"/s{size}").hosts
    etcdctl = ["etcdctl", "--endpoints", server.endpoint, "get", "--prefix", hosts, "-w", "json"]
    return {
        "etcdctl": lambda: run_timed(etcdctl, ctl),
        "status": lambda: run_timed(allocator_cli("status", "-o", "json"), env),
        "summary": lambda: run_timed(allocator_cli("status", "--summary", "-o", "json"), env),
    }


def _commands(
    size: int, env: dict[str, str], files: dict[tuple[int, int | None], Path]
) -> dict[str, Callable[[], float]]:
    host = host_name(size // 2)
    moves, applies = [0], [0]

    def move() -> float:
        moves[0] += 1
        gpu = 6 + moves[0] % 2  # GPUs 6 and 7 are free on every host of the fleet
        return run_timed(allocator_cli("set", "job=bench", f"gpus={gpu}", f"host={host}"), env)

    # CI applies a policy from a fresh checkout, in a process of its own: no command
    # server there, so none here (the ratio is then of whole commands, as it always was).
    ci = {**env, "ALLOCATOR_SERVER": "0"}

    def apply() -> float:
        applies[0] += 1  # host 42's entry: 7 GPUs, then the range's 8 again
        path = files[size, 7 if applies[0] % 2 else None]
        return run_timed(allocator_cli("policy", "apply", str(path)), ci)

    def get() -> float:
        return run_timed(allocator_cli("get", f"job={job_name(size // 2, 3)}"), env)

    def status() -> float:
        return run_timed(allocator_cli("status", f"host={host}", "-o", "json"), env)

    return {
        f"CLI set {size}": move,
        f"CLI get {size}": get,
        f"CLI status host= {size}": status,
        f"policy apply of a one-host change {size}": apply,
    }
