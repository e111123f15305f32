"""Where free GPUs are, and what is broken: the page's small answers of the fleet view.

``/api/v1/free``: the hosts with the most free GPUs, of one pool or all.

Counted from each host's cells on the fleet grid (a GPU is free when its
cell is: nobody holds it, it is healthy, not reserved, its agent not gone),
so the answer is small whatever the fleet's size and agrees with the heatmap.
``/api/v1/broken``: :func:`allocator.serve.broken.broken_json`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from allocator.errors import InvalidInput
from allocator.serve.broken import broken_json
from allocator.serve.fleet_view import FleetView
from allocator.serve.host_view import CELL_STATES

__all__ = ["MAX_HOSTS", "broken_answer", "free_answer", "free_json"]

#: Most hosts one answer lists (``limit=``).
MAX_HOSTS = 1000
#: Rows listed when no ``limit=`` is given.
DEFAULT_LIMIT = 20
_FREE = str(CELL_STATES.index("free"))


def free_json(view: FleetView, pool: str | None, limit: int) -> dict[str, Any]:
    """The hosts of ``pool`` (``None``: every host) with a free GPU, most free first.

    ``hosts``: the first ``limit`` (host, pool, free, total); ``hosts_total``:
    how many hosts have one; ``free``/``gpus``: free GPUs of all GPUs counted.
    """
    if pool is not None and pool not in view.pool_names():
        raise InvalidInput(f"pool={pool!r}: no such pool (expected one of the policy's)")
    rows = view.kept(f"free:{pool}", lambda: _counted(view, pool))
    free, gpus, hosts = rows
    return {
        "pool": pool,
        "hosts": [{"host": h, "pool": p, "free": n, "total": t} for n, h, p, t in hosts[:limit]],
        "hosts_total": len(hosts),
        "free": free,
        "gpus": gpus,
        "revision": view.revision,
    }


def _counted(
    view: FleetView, pool: str | None
) -> tuple[int, int, list[tuple[int, str, str | None, int]]]:
    free = gpus = 0
    hosts: list[tuple[int, str, str | None, int]] = []
    for name in view.names():
        host = view.views[name]
        if pool is not None and host.pool != pool:
            continue
        count = host.cells.count(_FREE)
        free += count
        gpus += len(host.cells)
        if count:
            hosts.append((count, name, host.pool, len(host.cells)))
    hosts.sort(key=lambda row: (-row[0], row[1]))
    return free, gpus, hosts


def free_answer(view: FleetView, query: Mapping[str, str]) -> bytes:
    """``/api/v1/free?pool=P&limit=N`` as JSON."""
    _known(query, ("pool", "limit"), "/api/v1/free")
    limit = _limit(query.get("limit"))
    return json.dumps(free_json(view, query.get("pool") or None, limit)).encode()


def broken_answer(view: FleetView, query: Mapping[str, str]) -> bytes:
    """``/api/v1/broken?limit=N`` as JSON."""
    _known(query, ("limit",), "/api/v1/broken")
    document = broken_json(view.broken, view.pools, _limit(query.get("limit")))
    return json.dumps({**document, "revision": view.revision}).encode()


def _known(query: Mapping[str, str], names: tuple[str, ...], path: str) -> None:
    unknown = sorted(set(query) - set(names))
    if unknown:
        raise InvalidInput(f"{unknown[0]}: not a parameter of {path} (expected {', '.join(names)})")


def _limit(raw: str | None) -> int:
    """``limit=``: a whole number from 1 to :data:`MAX_HOSTS`; :class:`InvalidInput` otherwise."""
    if raw is None:
        return DEFAULT_LIMIT
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= MAX_HOSTS:
        raise InvalidInput(f"limit={raw!r}: expected a whole number from 1 to {MAX_HOSTS}")
    return int(raw)
