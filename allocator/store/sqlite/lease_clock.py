"""The clock SQLite leases expire by: the same in every process on the host, never stepped.

Several processes share one store file, so a lease's expiry must be a time
every one of them reads on the same scale: a per-process clock will not do.
The wall clock is shared but steps (NTP correcting a drifted clock, an
operator's ``date -s``): a step forward longer than a TTL would end every
live lease at the next write, and every ``allocator run`` with it.

Linux's ``CLOCK_BOOTTIME`` is the seconds since this boot, the same in every
process, never stepped, and counting time suspended too (a lease is not
kept alive across a suspend any more than across a pause). Elsewhere the
monotonic clock is the closest there is.

Across a reboot the clock starts again from zero, so a lease written before
it ends further ahead than ``now + ttl``, which no lease of this boot can
(a grant or a refresh sets ``now + ttl``). Such a lease is over: every
process that held it died with the boot. :data:`EXPIRED` says so in SQL;
:data:`SLACK` covers a reader whose clock was read a moment before a
writer's refresh committed.
"""

from __future__ import annotations

import time

__all__ = ["EXPIRED", "LIVE", "SLACK", "lease_clock"]

#: Seconds a lease's end may lie past ``now + ttl`` and still be of this boot.
SLACK = 1.0

#: A lease is over: its end has come, or it lies beyond any end this boot can give
#: (a lease of an earlier boot). Parameters: now, now.
EXPIRED = f"(leases.expires_at <= ? OR leases.expires_at > ? + leases.ttl + {SLACK})"
#: The contrary of :data:`EXPIRED`. Parameters: now, now.
LIVE = f"(leases.expires_at > ? AND leases.expires_at <= ? + leases.ttl + {SLACK})"

_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def lease_clock() -> float:
    """Seconds on the host's lease clock (since boot on Linux)."""
    if _BOOTTIME is not None:
        return time.clock_gettime(_BOOTTIME)
    return time.monotonic()
