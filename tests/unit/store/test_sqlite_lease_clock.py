"""Lease expiry in the SQLite store follows a clock the wall clock's steps do not move.

Several processes share one store file, so they must agree on when a lease
ends. The wall clock is the same in every process but steps (NTP, an
operator's ``date -s``); here a child process sees the wall clock one hour
ahead (its ``time.time`` shifted before anything is imported, as after a
step forward) and writes to the store, which is when expired leases are
reaped. A lease kept alive by this process must survive it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from allocator.store.sqlite.store import SqliteStore
from tests.support.waiting import wait_for

# argv: db path, seconds the wall clock stepped forward. Writes one key (every
# write reaps the leases it judges expired) and reads the leased key back.
STEPPED_WRITER = """
import sys, time
_wall = time.time
time.time = lambda: _wall() + float(sys.argv[2])
from allocator.store.sqlite.store import SqliteStore
from tests.support.waiting import wait_for
store = SqliteStore(sys.argv[1])
store.put("/stepped/writer", b"x")
print("seen" if store.get("/run/holder") is not None else "gone", flush=True)
store.close()
"""


def _stepped_write(db: Path, step: float) -> str:
    child = subprocess.run(
        [sys.executable, "-c", STEPPED_WRITER, str(db), str(step)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr
    return child.stdout.strip()


def test_a_wall_clock_step_longer_than_the_ttl_reaps_no_live_lease(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    holder = SqliteStore(db)
    lease = holder.grant_lease(30)
    holder.put("/run/holder", b"held", lease=lease)

    assert _stepped_write(db, 3600) == "seen"  # the other process still sees it

    holder.refresh_lease(lease)  # still this process's lease: no LeaseLost
    assert holder.get("/run/holder") is not None
    holder.close()


def test_a_lease_nobody_refreshes_still_ends_after_its_ttl(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    holder = SqliteStore(db)
    holder.put("/run/holder", b"held", lease=holder.grant_lease(0.2))
    holder.close()

    wait_for("the unrefreshed lease to end", lambda: _stepped_write(db, 0) == "gone")


def test_a_lease_of_an_earlier_boot_ends_at_once(tmp_path: Path) -> None:
    """The clock restarts from zero at boot: a lease written before the reboot
    ends further ahead than any lease can (now + its TTL), so it is over."""
    db = tmp_path / "store.db"
    before_reboot = SqliteStore(db, clock=lambda: 1_000_000.0)  # up for 11 days
    before_reboot.put("/run/holder", b"held", lease=before_reboot.grant_lease(30))
    before_reboot.close()

    after_reboot = SqliteStore(db, clock=lambda: 40.0)  # up for 40 s
    assert after_reboot.get("/run/holder") is None
    after_reboot.put("/other", b"x")  # reaped by the first write, with a delete event
    assert after_reboot.list("/run/").items == ()
    after_reboot.close()
