"""The usage rollup: each ended holding's GPU-time, filed by the day it ended.

``allocator usage`` reads this instead of every host's history. Each entry
that ends a holding (``set``, ``move``, ``release``, ``expired``) records
when the holding began (``started``, its assignment's time) and its slots;
the append that writes it (:func:`allocator.history.append.append_plan`)
writes, in the same transaction, one small row key::

    /allocator/v1/history/usage/days/<YYYY-MM-DD>/hosts/<host>/<seq>

named after the entry itself, so a row is written exactly once and never
counted twice. Its value is a JSON list of rows ``[host, job, holder, gpus,
slots, start, end]`` (unix seconds; a transaction across several hosts
writes one key for all of them). Rows are filed by the UTC day their
holding *ended*, and keep its exact start and end: a window reads the days
from its start's day to today (8 prefix reads for 7 days) and clips each
row to the window exactly, so no bucket is pro-rated. Holdings still open
are counted up to now from the current assignments, as before.

History written before the rollup has no rows: :func:`rebuild` (``allocator
usage --rebuild``) folds it once, writes its ended holdings (those whose
end entry wrote no row) and then the marker :func:`marker_key`. Until that
marker exists usage is counted from history as before, and says so
(``"source": "history"``). ``allocator history prune`` merges each past
day's row keys, :data:`MERGED` into one and those again (a daily rollup:
a 7-day window then reads a few hundred keys), and drops the days that
ended before its age (the rollup is kept as long as history is; each ended
holding is one row of about 80 bytes).

Times are the writers' clocks (history's reader also bounds them by the
store's order of the entries; a row keeps what its writer saw).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta

import msgspec

from allocator.errors import BadRecord
from allocator.history.stream import OnBad
from allocator.records.types import HistoryEntry
from allocator.store import Compare, Delete, KeyValue, Op, Put, Read, Store
from allocator.util.times import format_time, parse_time

#: A holding as the count needs it: host, job, holder, GPUs, slots, start and end (unix
#: seconds): what one row of the rollup stores.
Span = tuple[str, str, str, int, int, float, float]


def holder_of(entry: HistoryEntry) -> str:
    """Who held what ``entry`` set: its ``holder``, else its writer's user part."""
    if entry.holder:
        return entry.holder
    return entry.by.split("@", 1)[0] or entry.by


__all__ = [
    "DAYS_PER_READ",
    "MAX_ROWS",
    "MERGED",
    "PRUNED_DAYS",
    "Row",
    "Span",
    "compactions",
    "day_prefix",
    "holder_of",
    "marker_key",
    "marker_value",
    "read_days",
    "read_rollup",
    "rollup_ops",
    "row_of",
    "rows_of",
    "stale_days",
    "usage_prefix",
]

#: Days before the cutoff one prune deletes (a prune a year catches every one).
PRUNED_DAYS = 400
#: Row keys one compaction merges into one (a compare and a delete each: 61 operations).
MERGED = 30
#: The most rows a merged key holds (about 90 bytes a row).
MAX_ROWS = 2000
#: Day prefixes one :func:`read_days` request reads (etcd's default cap is 128 operations).
DAYS_PER_READ = 64
#: Entries that end a holding.
_ENDS = ("set", "move", "release", "expired")
#: A row: host, job, holder, gpus, slots, start and end (unix seconds).
Row = Span
_ROWS = msgspec.json.Decoder(list[tuple[str, str, str, int, int, float, float]])


def usage_prefix(history: str) -> str:
    """Prefix of every rollup key, below history's root."""
    return f"{history}usage/"


def marker_key(history: str) -> str:
    """The key saying the rollup holds every holding history had (written by a rebuild)."""
    return f"{usage_prefix(history)}complete"


def day_prefix(history: str, day: datetime) -> str:
    """Prefix of the rows of holdings that ended on ``day`` (UTC)."""
    return f"{usage_prefix(history)}days/{day.astimezone(UTC):%Y-%m-%d}/"


def row_of(entry: HistoryEntry) -> Row | None:
    """The row of the holding ``entry`` ends (pure); ``None``: it ends none, or an older entry."""
    if entry.action not in _ENDS or entry.host is None or entry.job is None:
        return None
    start, end = parse_time(entry.started or ""), parse_time(entry.at)
    if entry.from_mode != "gpu" or not entry.from_gpus or start is None or end is None:
        return None
    begun = min(start, end).timestamp()
    slots = entry.from_slots or 1
    return (
        entry.host,
        entry.job,
        entry.from_holder or holder_of(entry),
        len(entry.from_gpus),
        slots,
        begun,
        end.timestamp(),
    )


def rows_of(entries: Iterable[HistoryEntry]) -> list[Row]:
    """The rows of the holdings ``entries`` end."""
    return [row for row in map(row_of, entries) if row is not None]


def rollup_ops(history: str, entry_key: str, rows: Sequence[Row]) -> list[Op]:
    """The one write of ``rows``, named after the entry (key) that ended them (pure)."""
    if not rows or not history or not entry_key.startswith(history):
        return []
    end = datetime.fromtimestamp(rows[0][6], UTC)
    key = f"{day_prefix(history, end)}{entry_key[len(history) :]}"
    return [Put(key, msgspec.json.encode(list(rows)))]


def read_rollup(
    store: Store, history: str, since: datetime, until: datetime, on_bad: OnBad
) -> list[Row] | None:
    """The ended holdings of the days ``since`` .. ``until``; ``None``: no rollup (not rebuilt)."""
    days = _days(since, until)
    reads = [Read(marker_key(history))] + [Read(day_prefix(history, d), prefix=True) for d in days]
    marker, *listings = store.read_many(reads)
    if not marker.items:
        return None
    # Each name once, however many rows share it: a week of a busy fleet is
    # hundreds of thousands of rows naming a few thousand hosts, jobs and holders.
    names: dict[str, str] = {}
    name = names.setdefault
    found: list[Row] = []
    for listing in listings:
        for item in listing.items:
            found += [
                (name(host, host), name(job, job), name(holder, holder), gpus, slots, start, end)
                for host, job, holder, gpus, slots, start, end in _rows(item, on_bad)
            ]
    return found


def read_days(
    store: Store, history: str, since: datetime, until: datetime, on_bad: OnBad
) -> list[Row]:
    """The rows filed on the days ``since`` .. ``until``, with or without the rebuild's marker.

    :data:`DAYS_PER_READ` day prefixes a request (etcd caps the operations of one).
    """
    days = _days(since, until)
    found: list[Row] = []
    for first in range(0, len(days), DAYS_PER_READ):
        chunk = days[first : first + DAYS_PER_READ]
        for listing in store.read_many([Read(day_prefix(history, d), prefix=True) for d in chunk]):
            for item in listing.items:
                found += _rows(item, on_bad)
    return found


def stale_days(history: str, cutoff: datetime) -> list[Delete]:
    """Deletes of the :data:`PRUNED_DAYS` days wholly before ``cutoff`` (pure, no read).

    One prefix delete a day: listing the rows to find their days would read them all.
    """
    last = cutoff.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    days = (last - timedelta(days=n) for n in range(1, PRUNED_DAYS + 1))
    return [Delete(day_prefix(history, day), prefix=True) for day in days]


def compactions(history: str, listing: Sequence[KeyValue]) -> list[tuple[list[Compare], list[Op]]]:
    """Transactions merging one day's row keys (``listing``), :data:`MERGED` a key (pure).

    Each writes the merged rows under the name of the first key it merges
    (``rolled/...``) and deletes those it merged, comparing each, so two
    prunes at once, or a writer adding a late row, never count a row twice.
    A merged key holds at most :data:`MAX_ROWS` rows (about 180 KiB, within
    every backend's value limit); run again, merged keys merge again.
    """
    found = []
    for chunk in _chunks(listing):
        rows = [row for item in chunk for row in _ROWS.decode(item.value)]
        key = _merged_key(history, chunk[0].key)
        compares = [Compare(item.key, item.mod_revision) for item in chunk]
        ops: list[Op] = [Delete(item.key) for item in chunk if item.key != key]
        found.append((compares, [*ops, Put(key, msgspec.json.encode(rows))]))
    return found


def _chunks(listing: Sequence[KeyValue]) -> list[list[KeyValue]]:
    """Runs of at most :data:`MERGED` keys of at most :data:`MAX_ROWS` rows in all (2 or more)."""
    found: list[list[KeyValue]] = []
    chunk: list[KeyValue] = []
    rows = 0
    for item in listing:
        count = _count(item.value)
        if chunk and (len(chunk) == MERGED or rows + count > MAX_ROWS):
            found.append(chunk)
            chunk, rows = [], 0
        if count < MAX_ROWS:
            chunk.append(item)
            rows += count
    found.append(chunk)
    return [c for c in found if len(c) > 1]


def _merged_key(history: str, key: str) -> str:
    day, _, tail = key[len(f"{usage_prefix(history)}days/") :].partition("/")
    return key if tail.startswith("rolled/") else f"{usage_prefix(history)}days/{day}/rolled/{tail}"


def _count(value: bytes) -> int:
    """How many rows a row key holds; not rows: :data:`MAX_ROWS` (never merged: the reader
    reports it)."""
    try:
        return len(_ROWS.decode(value))
    except (msgspec.DecodeError, msgspec.ValidationError):
        return MAX_ROWS


def _days(since: datetime, until: datetime) -> list[datetime]:
    day = since.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    found = []
    while day <= until:
        found.append(day)
        day += timedelta(days=1)
    return found


def _rows(item: KeyValue, on_bad: OnBad) -> list[Row]:
    try:
        return _ROWS.decode(item.value)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        on_bad(BadRecord(item.key, f"not usage rows: {exc}"))
        return []


def marker_value(now: datetime) -> bytes:
    """The marker's value: when the rollup was rebuilt."""
    return msgspec.json.encode({"rebuilt_at": format_time(now)})
