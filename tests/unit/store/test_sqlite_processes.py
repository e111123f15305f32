"""Several real processes sharing one SQLite store file.

Children are separate Python interpreters (``sys.executable -c``) that open
the store themselves. Where a test needs them to act together, each child
prints ``ready`` and waits for a line on stdin, so the race starts when the
parent says so rather than after a sleep.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from allocator.store import Put
from allocator.store.sqlite.store import SqliteStore

CHILD_TIMEOUT_S = 120

# argv: db path, key, index. Prints "won" or "lost" after the go line.
RACE_CHILD = """
import sys
from allocator.errors import CasConflict
from allocator.store.sqlite.store import SqliteStore
store = SqliteStore(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
try:
    store.put(sys.argv[2], sys.argv[3].encode(), expect_revision=0)
    print("won", flush=True)
except CasConflict:
    print("lost", flush=True)
store.close()
"""

# argv: db path, index, rounds. Each round: one CAS increment of /counter
# (retried until it wins) and one plain put of its own key. Prints the
# revisions its writes returned, as JSON.
COUNTER_CHILD = """
import json, sys
from allocator.errors import CasConflict
from allocator.store.sqlite.store import SqliteStore
store = SqliteStore(sys.argv[1])
index, rounds = sys.argv[2], int(sys.argv[3])
print("ready", flush=True)
sys.stdin.readline()
revisions = []
for i in range(rounds):
    while True:
        current = store.get("/counter")
        value = int(current.value) if current else 0
        expected = current.mod_revision if current else 0
        try:
            revisions.append(store.put("/counter", str(value + 1).encode(),
                                       expect_revision=expected))
            break
        except CasConflict:
            continue
    revisions.append(store.put(f"/own/{index}/{i}", b"x"))
print(json.dumps(revisions), flush=True)
store.close()
"""

# argv: db path, now (the child's clock), ttl. Grants a lease, puts /leased
# with it, and exits without revoking: only expiry can remove the key.
LEASE_CHILD = """
import sys
from allocator.store.sqlite.store import SqliteStore
now = float(sys.argv[2])
store = SqliteStore(sys.argv[1], clock=lambda: now)
lease = store.grant_lease(float(sys.argv[3]))
print(store.put("/leased", b"from a child", lease=lease), flush=True)
store.close()
"""

# argv: db path, start revision, count. Prints the events it saw, as JSON.
WATCH_CHILD = """
import json, sys, time
from allocator.store.sqlite.store import SqliteStore
store = SqliteStore(sys.argv[1])
watch = store.watch("/w/", int(sys.argv[2]))
count = int(sys.argv[3])
print("ready", flush=True)
events, deadline = [], time.monotonic() + 60
while len(events) < count and time.monotonic() < deadline:
    events.extend(watch.next(1.0))
print(json.dumps([[e.type, e.key, e.revision] for e in events]), flush=True)
watch.close()
store.close()
"""


def spawn(code: str, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_ready(children: list[subprocess.Popen[str]]) -> None:
    for child in children:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line == "ready\n", child.communicate(timeout=CHILD_TIMEOUT_S)[1]


def start_all(children: list[subprocess.Popen[str]]) -> None:
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()


def finish(child: subprocess.Popen[str]) -> str:
    out, err = child.communicate(timeout=CHILD_TIMEOUT_S)
    assert child.returncode == 0, err
    return out


def test_sixteen_processes_racing_to_create_one_key_have_one_winner(tmp_path: Path) -> None:
    db = tmp_path / "fresh" / "store.db"  # fresh: the children also race to create it
    children = [spawn(RACE_CHILD, db, "/contested", i) for i in range(16)]
    wait_ready(children)

    start_all(children)
    outcomes = [finish(c).strip() for c in children]

    assert outcomes.count("won") == 1
    assert outcomes.count("lost") == 15
    store = SqliteStore(db)
    got = store.get("/contested")
    store.close()
    assert got is not None
    assert got.value == str(outcomes.index("won")).encode()


def test_concurrent_processes_never_lose_an_update(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    writers, rounds = 4, 15
    before = SqliteStore(db)
    base = before.list("/").revision
    before.close()
    children = [spawn(COUNTER_CHILD, db, i, rounds) for i in range(writers)]
    wait_ready(children)

    start_all(children)
    revisions = [r for c in children for r in json.loads(finish(c))]

    store = SqliteStore(db)
    counter = store.get("/counter")
    listing = store.list("/own/")
    store.close()
    total = writers * rounds * 2
    assert counter is not None and int(counter.value) == writers * rounds
    assert len(listing.items) == writers * rounds
    # Every write got its own revision, and revisions have no gaps.
    assert sorted(revisions) == list(range(base + 1, base + total + 1))
    assert listing.revision == base + total


def test_an_expired_lease_of_a_dead_process_is_reaped_by_another(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    then = 1_000_000.0
    written = int(finish(spawn(LEASE_CHILD, db, then, 5)))

    before_expiry = SqliteStore(db, clock=lambda: then + 4)
    assert before_expiry.get("/leased") is not None
    before_expiry.close()

    after_expiry = SqliteStore(db, clock=lambda: then + 6)
    watch = after_expiry.watch("/", written + 1)
    assert after_expiry.get("/leased") is None  # hidden at once, by a read that writes nothing
    assert watch.next(0) == []
    after_expiry.put("/other", b"x")  # the next writer reaps, with a delete event
    events = watch.next(0)
    watch.close()
    after_expiry.close()
    assert [(e.type, e.key, e.revision) for e in events] == [
        ("delete", "/leased", written + 1),
        ("put", "/other", written + 2),
    ]


def test_a_watch_in_another_process_sees_every_write(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    store = SqliteStore(db)
    start = store.put("/unwatched", b"x") + 1
    watcher = spawn(WATCH_CHILD, db, start, 4)
    wait_ready([watcher])

    expected = [
        ["put", "/w/a", store.put("/w/a", b"1")],
        ["put", "/w/b", store.txn([], [Put("/w/b", b"2"), Put("/x/c", b"3")])],
        ["put", "/w/a", store.put("/w/a", b"4")],
    ]
    store.delete("/w/b")
    expected.append(["delete", "/w/b", store.list("/").revision])
    store.close()

    assert json.loads(finish(watcher)) == expected
