"""``allocator usage --by team --since 7d`` at 12,500 hosts: read from the rollup, not history.

The store (SQLite) holds what 1,000,000 history entries leave in the usage
rollup: 500,000 ended holdings (a set and its release each), 40 per host,
spread over the 28 days before now, one row key each as the appends write
them (:mod:`allocator.history.rollup`), the marker a rebuild writes, and
one open 8-GPU assignment per host; then ``history prune`` merges the past
days' keys, as the daily prune does. The rows are written directly as the
fixture (appending a million entries is not what is measured). The CLI
runs as an operator runs it; its wall time and peak RSS (the child's
``ru_maxrss``) are the rows. Run alone: ``python -m bench.bench_usage
[--smoke]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from allocator.errors import BadRecord
from allocator.history.prune import prune_history
from allocator.history.rollup import marker_key, marker_value, rollup_ops
from allocator.records.keys import KeyLayout
from allocator.records.types import Assignment
from allocator.store import Op, Put, Store, open_store
from allocator.util.times import format_time
from bench.bench_serve import page_open_rss
from bench.common import Row, allocator_cli, clean_env, value_row
from bench.fleet import host_name, write_busy_fleet

__all__ = ["fill", "rows"]

_SCALE = {"full": (12_500, 40), "smoke": (50, 4)}
_BATCH = 60
_DAYS = 28


def fill(
    store: Store,
    layout: KeyLayout,
    hosts: int,
    per_host: int,
    now: datetime,
    *,
    open_too: bool = True,
) -> None:
    """``per_host`` ended holdings a host over :data:`_DAYS` days, and one open one each.

    ``open_too=False``: the hosts' holdings are written by someone else (the
    status page's busy fleet), only the history here.
    """
    history = layout.history
    span = _DAYS * 86_400 / per_host
    ops: list[Op] = []
    for index in range(hosts):
        host = host_name(index)
        if open_too:
            held = Assignment(job="open", host=host, gpus=tuple(range(8)), mode="gpu",
                              updated_by="alice@x",
                              updated_at=format_time(now - timedelta(hours=3)),
                              holder=f"user{index % 200}")  # fmt: skip
            ops.append(Put(layout.assignment(host, "open"), held.to_json()))
        for n in range(per_host):
            end = now.timestamp() - n * span - 60
            row = (host, f"job{n}", f"user{(index + n) % 200}", 1 + n % 8, 1, end - span / 2, end)
            ops += rollup_ops(history, f"{history}hosts/{host}/{2 * n + 1:012d}", [row])
            if len(ops) >= _BATCH:
                store.txn([], ops)
                ops = []
    if ops:
        store.txn([], ops)
    store.put(marker_key(history), marker_value(now))


#: Runs the command in argv, passes its stdout on, and reports its peak RSS on stderr.
_PEAK_OF_ONE = """
import json, resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, check=True)
sys.stdout.buffer.write(done.stdout)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"peak_kib": peak}), file=sys.stderr)
"""


def _ignore(_bad: BadRecord) -> None:
    pass


def rows(args: Any, work: Path) -> list[Row]:
    """Time and peak RSS of ``usage --by team --since 7d`` on the rollup of 1,000,000 entries."""
    hosts, per_host = _SCALE["smoke" if args.smoke else "full"]
    url = f"sqlite://{work / 'usage.db'}"
    started = time.perf_counter()
    # The status page's busy fleet (2 jobs a host, held now), and its history beside it.
    write_busy_fleet(url, KeyLayout().prefix, hosts)
    store = open_store(url)
    try:
        now = datetime.now(UTC)
        fill(store, KeyLayout(), hosts, per_host, now, open_too=False)
        merged = time.perf_counter()
        # What the daily ``history prune`` leaves: the past days' keys merged.
        prune_history(store, KeyLayout(), frozenset(), 86_400 * 30, now, _ignore)
        merged = time.perf_counter() - merged
    finally:
        store.close()
    loaded = time.perf_counter() - started
    # In a process of its own (no command server), so its memory is its own; and
    # measured by a parent of its own: RUSAGE_CHILDREN here would be the largest
    # child of the whole bench run (a 12,500-host loader, serve).
    env = clean_env(ALLOCATOR_STORE=url, ALLOCATOR_SERVER="0")
    argv = allocator_cli("usage", "--by", "team", "--since", "7d", "-o", "json")
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_OF_ONE, *argv],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    seconds = time.perf_counter() - began
    peak = json.loads(done.stderr.strip().splitlines()[-1])["peak_kib"] / 1024
    source = json.loads(done.stdout)["source"]
    note = (
        f"{hosts:,} hosts, {hosts * per_host * 2:,} history entries' rows over {_DAYS} days "
        f"(source: {source}), merged by history prune ({merged:.0f} s); loading took {loaded:.0f} s"
    )
    served = page_open_rss(url, KeyLayout().prefix, hosts, work)
    return [
        value_row("usage --by team --since 7d, time", seconds, 1.0, "s", note=note),
        value_row("usage --by team --since 7d, peak RSS", peak, 100.0, "MiB", note=note),
        value_row(
            f"serve RSS, {hosts:,} hosts, page open with its usage panel",
            served,
            400.0,
            "MiB",
            note=f"peak (VmHWM) after every request the page makes on opening; {note}",
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory() as work:
        for row in rows(args, Path(work)):
            print(f"{row.name}: {row.ours:.3f} {row.unit} ({row.target}) {row.note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
