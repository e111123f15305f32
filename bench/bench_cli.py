"""Wall time of whole CLI processes, against baselines measured in the same run.

* ``python -c pass`` (the interpreter's own start-up) vs ``allocator --help``
  and ``allocator get`` on SQLite;
* ``allocator set`` on SQLite and on etcd vs ``etcdctl put`` on the same etcd
  (the store's own CLI: the floor an operator already lives with).

Each command runs ``--rounds`` times, interleaved, so machine noise hits all
alike; medians are printed with ratios against the baseline.
Usage: ``python bench/bench_cli.py [--rounds N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.etcd_server import EtcdServer  # noqa: E402

POLICY = REPO / "config" / "policy.example.yaml"


def timed(argv: list[str], env: dict[str, str]) -> float:
    """Seconds one process takes from spawn to exit; it must succeed."""
    started = time.perf_counter()
    result = subprocess.run(argv, env=env, capture_output=True, check=False)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {result.stderr.decode().strip()}")
    return elapsed


def allocator(*args: str) -> list[str]:
    """The installed CLI, run the way an operator runs it."""
    return [str(Path(sys.executable).parent / "allocator"), *args]


def main() -> None:
    """Run every command ``--rounds`` times and print medians and ratios."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=30)
    rounds = parser.parse_args().rounds
    with tempfile.TemporaryDirectory() as tmp:
        server = EtcdServer(Path(tmp) / "etcd")
        server.start()
        try:
            # As installed: byte-compiled (an editable checkout may forbid .pyc files).
            subprocess.run(
                [sys.executable, "-m", "compileall", "-q", str(REPO / "allocator")], check=True
            )
            base = {
                k: v
                for k, v in os.environ.items()
                if not k.startswith("ALLOCATOR_") and k != "PYTHONDONTWRITEBYTECODE"
            }
            sqlite = {**base, "ALLOCATOR_STORE": f"sqlite://{tmp}/s.db"}
            etcd = {**base, "ALLOCATOR_STORE": server.url}
            for env in (sqlite, etcd):
                timed(allocator("policy", "apply", str(POLICY)), env)
                timed(allocator("set", "job=train", "gpus=0", "host=node1"), env)
            commands = {
                "python -c pass": ([sys.executable, "-c", "pass"], base),
                "allocator --help": (allocator("--help"), base),
                "allocator get (sqlite)": (allocator("get", "job=train", "host=node1"), sqlite),
                "allocator set (sqlite)": (
                    allocator("set", "job=train", "gpus=0", "host=node1"),
                    sqlite,
                ),
                "etcdctl put": (
                    ["etcdctl", "--endpoints", server.endpoint, "put", "/bench/k", "v"],
                    {**base, "ETCDCTL_API": "3"},
                ),
                "allocator set (etcd)": (
                    allocator("set", "job=train", "gpus=0", "host=node1"),
                    etcd,
                ),
            }
            samples: dict[str, list[float]] = {name: [] for name in commands}
            for _ in range(rounds):
                for name, (argv, env) in commands.items():
                    samples[name].append(timed(argv, env))
        finally:
            server.stop()
    medians = {name: statistics.median(values) * 1000 for name, values in samples.items()}
    baselines = {
        "allocator --help": "python -c pass",
        "allocator get (sqlite)": "python -c pass",
        "allocator set (sqlite)": "python -c pass",
        "allocator set (etcd)": "etcdctl put",
    }
    print(f"CLI wall time, median of {rounds} runs each (interleaved)")
    for name, median in medians.items():
        base_name = baselines.get(name)
        ratio = f"  {median / medians[base_name]:.1f}x {base_name}" if base_name else ""
        print(f"  {name:<24} {median:7.1f} ms{ratio}")


if __name__ == "__main__":
    main()
