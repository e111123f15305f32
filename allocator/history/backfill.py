"""The usage rollup's one-time backfill from history (``allocator usage --rebuild``).

History written before the rollup existed has no rows: this folds every
host's history once (:func:`allocator.history.usage.holdings`, the count
``usage`` made before) and writes the holdings it ended that no entry wrote
a row for, one key per (day, host)::

    /allocator/v1/history/usage/days/<YYYY-MM-DD>/rebuilt/<host>

then the marker (:func:`allocator.history.rollup.marker_key`) after which
``usage`` reads the rollup. An entry that wrote its own row is recognised
by its ``started`` field and skipped, so a holding is never counted twice;
a second rebuild overwrites the same keys.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime

import msgspec

from allocator.history.rollup import Row, day_prefix, marker_key, marker_value, row_of
from allocator.history.stream import OnBad, Stored, read_history
from allocator.history.usage import Holding, holdings, store_times
from allocator.records.keys import KeyLayout
from allocator.store import Op, Put, Store

__all__ = ["backfill_rows", "rebuild"]

#: Row keys one transaction writes (every backend takes 64 operations).
_BATCH = 60


def rebuild(store: Store, layout: KeyLayout, on_bad: OnBad, now: datetime) -> int:
    """Write the rows history holds that the rollup lacks, then the marker; how many rows."""
    entries = read_history(store, layout, on_bad, with_policy=False)
    rows = backfill_rows(entries, now)
    by_key: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        end = datetime.fromtimestamp(row[6], UTC)
        by_key[f"{day_prefix(layout.history, end)}rebuilt/{row[0]}"].append(row)
    puts: list[Op] = [Put(k, msgspec.json.encode(v)) for k, v in sorted(by_key.items())]
    for batch in _batches(puts):
        store.txn([], batch)
    store.put(marker_key(layout.history), marker_value(now))
    return len(rows)


def backfill_rows(entries: Sequence[Stored], now: datetime) -> list[Row]:
    """The ended holdings of ``entries`` whose end entry wrote no row of its own (pure)."""
    ordered = sorted(entries, key=lambda s: (s.revision, s.entry.seq))
    rolled = {
        (s.entry.host, s.entry.job, at)
        for s, at in zip(ordered, store_times(ordered, now), strict=True)
        if row_of(s.entry) is not None
    }
    return [
        _row(h)
        for h in holdings(ordered, {}, now)
        if h.end is not None and not h.ended_unrecorded and (h.host, h.job, h.end) not in rolled
    ]


def _row(holding: Holding) -> Row:
    assert holding.end is not None
    return (
        holding.host,
        holding.job,
        holding.holder,
        holding.gpus,
        holding.slots,
        holding.start.timestamp(),
        holding.end.timestamp(),
    )


def _batches(ops: list[Op]) -> Iterator[list[Op]]:
    for i in range(0, len(ops), _BATCH):
        yield ops[i : i + _BATCH]
