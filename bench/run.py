"""Run every benchmark; each prints its numbers next to a baseline from the same run.

Usage: ``python bench/run.py [--quick]`` (``--quick``: fewer rounds, 10 s CPU windows).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    """Run bench_cli, bench_etcd_watch and bench_agent in turn."""
    quick = "--quick" in sys.argv[1:]
    runs = [
        ["bench_cli.py", "--rounds", "10" if quick else "30"],
        ["bench_etcd_watch.py", *(["--rounds", "200"] if quick else [])],
        ["bench_agent.py", "--moves", "50", "--idle", "10" if quick else "60"],
    ]
    for script, *args in runs:
        print(f"== {script}", flush=True)
        subprocess.run([sys.executable, str(HERE / script), *args], check=True)


if __name__ == "__main__":
    main()
