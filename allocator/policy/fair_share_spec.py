"""The policy's ``fair_share:`` section: equal priorities ordered by recent usage.

```yaml
fair_share:
  half_life: 7d       # usage a week old counts half, two weeks old a quarter
  halve_at: 100       # decayed GPU-hours that halve a request's factor
  team_weight: 0.5    # the holder's teams' usage counts half as much as their own
```

Left out, the queue is ordered by priority, then first come, as before.
What the factor means is :mod:`allocator.recipes.queue.share`.
"""

from __future__ import annotations

from allocator.policy.idle_rule import Duration
from allocator.policy.model import FairShare
from allocator.policy.yamlspec.kinds import Number
from allocator.policy.yamlspec.structures import Field, Record

__all__ = ["FAIR_SHARE", "MAX_HALF_LIFE_SECONDS"]

#: The longest half-life: a join reads four of them of the daily rollup (121 days).
MAX_HALF_LIFE_SECONDS = 30 * 86_400.0

FAIR_SHARE = Record(
    FairShare,
    (
        Field(
            "half_life",
            Duration(minimum=3600.0, maximum=MAX_HALF_LIFE_SECONDS),
            "Usage this old counts half (like 7d; 1h to 30d). Usage older than four "
            "half-lives is not read.",
            required=True,
            attr="half_life_seconds",
        ),
        Field(
            "halve_at",
            Number(above=0.0, maximum=1e9),
            "Decayed GPU-hours at which a request's fair-share factor is 0.5 "
            "(factor = 2^(-usage/halve_at), Slurm's shares). Default 100.",
        ),
        Field(
            "team_weight",
            Number(minimum=0.0, maximum=1.0),
            "How much of the decayed usage of the holder's teams is added to the holder's own "
            "(0: the holder's alone, the default; 1: all of it).",
        ),
    ),
    description="Order requests of equal priority by their holders' recent usage "
    "(docs/queue.md#fair-share).",
)
