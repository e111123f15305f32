"""Keep a holding's lease alive while the process that holds it is stopped (Ctrl-Z).

A stopped process runs no thread, so its own :class:`~allocator.recipes.holding.LeaseKeeper`
stops too, and after the TTL its GPUs would go to someone else while its
command (stopped with it) still holds them in memory. So before ``allocator
run`` stops itself it starts this small process::

    python -m allocator.recipes.stopped_keeper LEASE TTL PID

which refreshes lease ``LEASE`` (the store from ``ALLOCATOR_STORE``, never
the command line, where anyone could read a URL's credentials) while
process ``PID`` is stopped, and exits as soon as it runs again (its own
keeper takes over) or is gone (the lease then expires as usual). It prints
``ready`` once the lease is refreshed, so ``run`` stops only once it is
covered.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

__all__ = ["keep_while_stopped", "main", "process_state"]

_LOOK_SECONDS = 0.05
_STOPPING_SECONDS = 5.0
_STOPPED = ("T", "t")  # stopped by a signal, or by a debugger


def process_state(pid: int) -> str:
    """``/proc``'s state letter of ``pid`` (``T`` stopped); "" once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            raw = stat.read()
    except OSError:
        return ""
    return raw[raw.rfind(b")") + 2 :][:1].decode()


def keep_while_stopped(
    refresh: Callable[[], None],
    ttl: float,
    state: Callable[[], str],
    announce: Callable[[], None],
    *,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Refresh every third of ``ttl`` while ``state()`` says stopped (``T``); return after.

    It first waits (a few seconds at most) for the holder to stop.

    A refresh that fails is tried at the next look; ``LeaseLost`` ends it (nothing to keep).
    """
    from allocator.errors import LeaseLost, StoreError
    from allocator.recipes.holding import refresh_interval

    refresh()
    announce()
    last = monotonic()
    until = last + _STOPPING_SECONDS  # the holder stops itself right after the announcement
    while state() not in _STOPPED and monotonic() < until:
        sleep(_LOOK_SECONDS)
    while state() in _STOPPED:
        sleep(_LOOK_SECONDS)
        if monotonic() - last < refresh_interval(ttl):
            continue
        try:
            refresh()
            last = monotonic()
        except LeaseLost:
            return
        except (StoreError, OSError):
            continue


def main(argv: list[str]) -> int:
    """``LEASE TTL PID``: keep the lease while PID is stopped; 0 when done, 1 if it cannot."""
    from allocator.errors import AllocatorError
    from allocator.store import open_store, resolve_store_url

    lease, ttl, pid = int(argv[0]), float(argv[1]), int(argv[2])
    try:
        store = open_store(resolve_store_url(None))
    except AllocatorError:
        return 1
    try:

        def announce() -> None:
            print("ready", flush=True)

        keep_while_stopped(lambda: store.refresh_lease(lease), ttl, lambda: process_state(pid),
                           announce)  # fmt: skip
    except AllocatorError:
        return 1
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
