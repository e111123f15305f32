"""One process of simulated agents' watches, for the fan-out rows (:mod:`bench.bench_fanout`).

Run as ``python -m bench.fanout_watchers``. The first line on stdin says
what to watch (JSON: ``url``, ``revision``, and ``agents``, each a list of
prefixes); every prefix is watched the way the agent's store link watches
(:func:`allocator.agent.sync.watches.start_watches`: a thread and a store
connection per watch, allocator's own etcd client). Once etcd has created
every watch the process prints ``{"ready": N}``.

Then, per line on stdin: ``mark`` forgets what arrived so far;
``report PREFIX...`` prints, per agent, the first arrival time and the bytes
and events that arrived since the mark on watches of those prefixes (an
agent's prefix counts if it starts with one of them); ``stop`` (or the end
of stdin) ends the process. Arrival times are read from
``CLOCK_MONOTONIC``, which every process on a Linux host shares, so the
parent can compare them with the moment it wrote.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from allocator.agent.sync.watches import Message, WatchEvents, WatchThread, start_watches
from allocator.store import Store, Watch, open_store

__all__ = ["Tally", "shared_clock"]


def shared_clock() -> float:
    """Seconds on the system-wide monotonic clock (the same in every process)."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def fail(error: str) -> NoReturn:
    """Say what went wrong (one line, whichever thread saw it first) and end the process."""
    with _FAILING:
        print(json.dumps({"error": error}), flush=True)
        os._exit(1)


_FAILING = threading.Lock()


class Tally:
    """One agent's link queue: what each of its watches delivered, and when."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[float, int, int]] = {}

    def put(self, item: Message, /) -> None:
        """Note a batch (the agent's queue gets it here); errors end the bench."""
        now = shared_clock()
        if not isinstance(item, WatchEvents):
            fail(f"{item.prefix}: {item.error}")
        size = sum(len(e.key.encode()) + len(e.value or b"") for e in item.events)
        with self._lock:
            first, total, count = self._seen.get(item.prefix, (now, 0, 0))
            self._seen[item.prefix] = (first, total + size, count + len(item.events))

    def clear(self) -> None:
        """Forget everything so far."""
        with self._lock:
            self._seen = {}

    def since(self, prefixes: tuple[str, ...]) -> tuple[float | None, int, int]:
        """First arrival, bytes and events on the watches of ``prefixes`` since the clear."""
        with self._lock:
            found = [v for k, v in self._seen.items() if k.startswith(prefixes)]
        if not found:
            return None, 0, 0
        return min(f[0] for f in found), sum(f[1] for f in found), sum(f[2] for f in found)


class Created:
    """Counts the watches etcd has created (``store.watch`` returns once it has)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.count = 0

    def opener(self, url: str) -> Callable[[], Store]:
        """``open_store(url)`` whose ``watch`` counts the watches it created."""

        def opened() -> Store:
            store = open_store(url)
            watch = store.watch

            def counted(prefix: str, start_revision: int) -> Watch:
                made = watch(prefix, start_revision)
                with self._cond:
                    self.count += 1
                    self._cond.notify_all()
                return made

            store.watch = counted  # type: ignore[method-assign]
            return store

        return opened

    def wait(self, count: int, deadline_s: float) -> bool:
        """Whether ``count`` watches were created within ``deadline_s``."""
        with self._cond:
            return self._cond.wait_for(lambda: self.count >= count, deadline_s)


def start(config: dict[str, Any]) -> tuple[list[Tally], list[WatchThread]]:
    """Every agent's watches, as its store link starts them, one agent at a time.

    Hosts of a fleet start at different moments; thousands of watches asked
    for at one instant would only measure how etcd copes with that.
    """
    created = Created()
    opener = created.opener(config["url"])
    tallies: list[Tally] = []
    threads: list[WatchThread] = []
    for prefixes in config["agents"]:
        tally = Tally()
        threads += start_watches(opener, prefixes, config["revision"], tally)
        tallies.append(tally)
        if not created.wait(len(threads), config.get("deadline", 60.0)):
            fail(f"{created.count} of {len(threads)} watches created")
    return tallies, threads


def serve(tallies: list[Tally]) -> None:
    """Answer the parent's lines until ``stop`` or the end of stdin."""
    for line in sys.stdin:
        command, *args = line.split()
        if command == "mark":
            for tally in tallies:
                tally.clear()
            print(json.dumps({"ok": True}), flush=True)
        elif command == "report":
            found = [tally.since(tuple(args)) for tally in tallies]
            print(json.dumps({"agents": found}), flush=True)
        elif command == "stop":
            return


def main() -> None:
    """Watch, say so, answer; leave without waiting for the watch threads."""
    tallies, threads = start(json.loads(sys.stdin.readline()))
    print(json.dumps({"ready": len(threads)}), flush=True)
    serve(tallies)
    sys.stdout.flush()
    os._exit(0)  # daemon threads blocked on sockets: nothing to tidy


if __name__ == "__main__":
    main()
