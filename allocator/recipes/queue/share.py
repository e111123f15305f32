"""Fair share: a waiting request's place among equal priorities, from its holder's recent usage.

Like Slurm's fair-share factor, simplified. A holder's **usage** is the
GPU-hours they held, each hour weighted by ``2^(-age/half_life)``: an hour
held now counts 1, one a half-life ago 1/2, two half-lives ago 1/4. The
holder's teams' usage (each team: its members' usage summed) is added,
times ``team_weight``. The **factor** is ``2^(-usage/halve_at)``: 1 for no
usage, 0.5 at ``halve_at`` decayed GPU-hours, 0.25 at twice that. Among
requests of one priority, the higher factor goes first; equal factors,
first come.

Why computed once, when the request joins, and stored in its entry: every
waiter decides its own turn from the same queue, so every waiter must see
the same order. Usage computed by each reader would differ with its clock
and with holdings ending meanwhile; the factor stored in the entry (as its
priority is) is the same for everyone. Like the priority, it is fixed until
the request leaves the queue.

Cheap: usage comes from the daily usage rollup
(:mod:`allocator.history.rollup`: a row per ended holding, filed by the day
it ended), the days of the last four half-lives (1/16 weight; older usage
is not read), not from history. Holdings still open count once they end,
and history written before the rollup counts once ``allocator usage
--rebuild`` has folded it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from allocator.history.rollup import Row, read_days

if TYPE_CHECKING:
    from allocator.policy.model import FairShare, Policy
    from allocator.recipes.context import Context

__all__ = [
    "WINDOW_HALF_LIVES",
    "Share",
    "decayed_hours",
    "read_share",
    "share_of",
    "usage_by_holder",
]

#: How far back usage is read, in half-lives: older usage weighs at most 1/16.
WINDOW_HALF_LIVES = 4


@dataclass(frozen=True, slots=True)
class Share:
    """A request's fair share as its queue entry stores it."""

    usage: float  # decayed GPU-hours (the holder's, plus their teams' times team_weight)
    factor: float  # 2^(-usage/halve_at): 1 for none, 0.5 at halve_at


def decayed_hours(gpus: int, start: float, end: float, now: float, half_life: float) -> float:
    """GPU-hours of ``gpus`` held from ``start`` to ``end`` (unix seconds), decayed to ``now``.

    The integral of ``gpus * 2^(-(now - t)/half_life)`` over the holding (the
    part after ``now``, a writer's clock ahead of ours, counts as now).
    """
    end, start = min(end, now), min(start, end, now)
    rate = math.log(2) / half_life
    weight = math.exp(-rate * (now - end)) - math.exp(-rate * (now - start))
    return gpus * weight / rate / 3600


def usage_by_holder(rows: Iterable[Row], now: float, half_life: float) -> dict[str, float]:
    """Each holder's decayed GPU-hours in ``rows`` (pure)."""
    found: dict[str, float] = {}
    for _host, _job, holder, gpus, _slots, start, end in rows:
        found[holder] = found.get(holder, 0.0) + decayed_hours(gpus, start, end, now, half_life)
    return found


def share_of(policy: Policy, settings: FairShare, holder: str, usage: Mapping[str, float]) -> Share:
    """``holder``'s share: their usage plus ``team_weight`` times each of their teams' (pure)."""
    total = usage.get(holder, 0.0)
    for team in policy.teams.values():
        if holder in team.members:
            total += settings.team_weight * sum(usage.get(m, 0.0) for m in team.members)
    factor = 2.0 ** (-total / settings.halve_at)
    return Share(round(total, 3), round(factor, 6))


def read_share(allocator: Context, policy: Policy, holder: str) -> Share | None:
    """``holder``'s share now, from the rollup; ``None`` when the policy has no ``fair_share``."""
    settings = policy.fair_share
    if settings is None:
        return None
    now = allocator.clock()
    since = now - timedelta(seconds=WINDOW_HALF_LIVES * settings.half_life_seconds)
    history = allocator.layout.history
    rows = read_days(allocator.store, history, since, now, allocator.on_bad_record)
    usage = usage_by_holder(rows, now.timestamp(), settings.half_life_seconds)
    return share_of(policy, settings, holder, usage)
