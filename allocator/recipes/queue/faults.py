"""What a waiter rides out (a store it cannot reach), and how SIGTERM ends it with its entry gone.

Kept apart from :mod:`allocator.recipes.queue.wait`'s loop: both are about
faults around a wait, not about whose turn it is.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

from allocator.errors import AmbiguousWrite, StoreUnavailable

__all__ = ["OUTAGE_S", "Outage", "default_sigterm", "exit_on_sigterm"]

#: How long a waiter waits for a store it cannot reach before it gives up (exit 4).
OUTAGE_S = 60.0


class Outage:
    """A waiter rides out a store it cannot reach (a restart, a blip) for up to ``OUTAGE_S``.

    Its entry's lease outlives a short outage (the keep-alive thread tries
    again), so the waiter keeps its place.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.since: float | None = None
        #: A take the outage cut off (its first entry's key, and the error): whether
        #: it landed is read, once the store answers, before anything else is taken.
        self.cut: tuple[str | None, AmbiguousWrite] | None = None

    def ride(self, down: StoreUnavailable) -> str:
        """Why it waits now; ``down`` itself once the store stayed away too long."""
        now = self.clock()
        self.since = now if self.since is None else self.since
        if now - self.since > OUTAGE_S:
            raise down
        return f"the store is unreachable, still in line: {down}"


def _on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through ``finally``: the entry is removed


def exit_on_sigterm() -> None:
    """Let SIGTERM end this waiter through its ``finally`` (default: die and leave the entry).

    Only where SIGTERM is left at its default, and only from the main thread
    (where Python runs signal handlers); a program's own handler is kept.
    """
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


def default_sigterm() -> None:
    """Put SIGTERM back to its default, where :func:`exit_on_sigterm` changed it."""
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
