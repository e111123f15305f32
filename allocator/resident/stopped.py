"""A stopped worker's lookout: continue it if its client dies while it is stopped.

Ctrl-Z stops the whole worker, with the thread that reads its connection. A
client killed while its command is stopped would then leave the worker
stopped for ever; a stopped ``run`` would keep its GPUs for ever too (its
keeper refreshes the lease while ``run`` is stopped). The client starts
this process as it stops (outside the worker's tree, which ``run`` stops
whole): once the client is gone it continues the worker, whose thread then
sees the connection closed and ends the command as for a client killed
outright (``run``: its tree is stopped and the GPUs are given back). It ends
as soon as the worker runs again or is gone.

Run as ``python -m allocator.resident.stopped WORKER_PID CLIENT_PID``.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from collections.abc import Callable, Sequence

from allocator.agent.kernel.procs import read_stat

__all__ = ["main", "watch"]

#: How often the worker's state is looked at (the client's end wakes this at once).
LOOK_SECONDS = 0.2
#: How long the worker may take to stop after this started; then it never stops.
STOPPING_SECONDS = 10.0


def main(argv: Sequence[str] | None = None) -> int:
    """Watch the worker and client ``argv`` names; 2 for words that name none."""
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        worker, client = int(words[0]), int(words[1])
        client_end = os.pidfd_open(client)
    except (IndexError, ValueError, OSError):
        return 2  # a client already gone: its worker's own thread saw that
    watch(worker, client_end, _state)
    return 0


def watch(worker: int, client_end: int, state: Callable[[int], str | None]) -> None:
    """Until ``worker`` has stopped and run again (or is gone): continue it once the client ends.

    ``client_end``: a descriptor that becomes readable when the client ends (a pidfd).
    """
    poller = select.poll()
    poller.register(client_end, select.POLLIN)
    stopped_seen = False
    started = time.monotonic()
    while True:
        now = state(worker)
        if now is None:
            return
        if now in ("T", "t"):
            stopped_seen = True
        elif stopped_seen or time.monotonic() - started > STOPPING_SECONDS:
            return  # `fg`: the worker reads its own connection again
        if poller.poll(LOOK_SECONDS * 1000):
            os.kill(worker, signal.SIGCONT)
            return


def _state(pid: int) -> str | None:
    """The process's state letter (``T``: stopped), or None when it is gone."""
    found = read_stat(pid)
    return None if found is None or found.state in ("Z", "X") else found.state


if __name__ == "__main__":
    sys.exit(main())
