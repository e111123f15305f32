"""The ``idle:`` rule of pools and jobs: its field spec, and the duration kind it reads.

```yaml
pools:
  a100: {hosts: [node1], idle: {after: 2h, action: release}}
jobs:
  serve: {command: [...], idle: {action: none}}   # an inference server may wait
```
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from allocator.policy.model import IdleRule
from allocator.policy.yamlspec.kinds import Enum, Number, Scalar
from allocator.policy.yamlspec.reader import Reader, join
from allocator.policy.yamlspec.structures import Field, Record
from allocator.util.durations import DURATION_PATTERN, duration_text, parse_duration

if TYPE_CHECKING:
    from yaml.nodes import Node

__all__ = ["IDLE", "MAX_IDLE_SECONDS", "MIN_IDLE_SECONDS", "AfterUnlessExempt", "Duration"]

#: Shorter than this and a job between two batches of work looks idle.
MIN_IDLE_SECONDS = 1.0
MAX_IDLE_SECONDS = 365 * 86400.0


class Duration(Scalar):
    """A duration written with a unit (``90s``, ``30m``, ``2h``, ``1h30m``, ``7d``), in seconds."""

    expected = "a duration like 30m or 2h"
    wants_text = True

    def __init__(self, *, minimum: float, maximum: float) -> None:
        self.minimum = minimum
        self.maximum = maximum

    def problem(self, value: Any, node: Node) -> str | None:
        """Refuse anything but a duration with units, within the bounds."""
        if not isinstance(value, str):
            return self.wrong_type(value, node) + "; write it with a unit, like 90s or 2h"
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            return str(exc)
        if seconds < self.minimum:
            return f"must be at least {duration_text(self.minimum)}, got {value}"
        if seconds > self.maximum:
            return f"must be at most {duration_text(self.maximum)}, got {value}"
        return None

    def convert(self, value: Any) -> float:
        """Return the seconds."""
        return parse_duration(value)

    def schema(self) -> dict[str, Any]:
        """A string with units (bounds are checked by the loader)."""
        return {"type": "string", "pattern": DURATION_PATTERN}

    def dump(self, value: Any) -> Any:
        """Seconds back to text (``7200.0`` -> ``2h``)."""
        return duration_text(float(value))


class AfterUnlessExempt:
    """``after`` is required unless ``action`` is ``none``."""

    def check(self, values: dict[str, Any], path: str, r: Reader) -> None:
        """Report a rule that would act but never says after how long."""
        written = join(path, "after") in r.lines  # there but invalid: reported already
        if values.get("action", "warn") != "none" and "after_seconds" not in values and not written:
            action = values.get("action", "warn")
            r.error(
                r.lines.get(path),
                path,
                f"missing required field 'after' (how long idle before action {action!r})",
            )

    def schema(self) -> dict[str, Any]:
        """``if action == none then anything else after is required``."""
        return {
            "if": {"properties": {"action": {"const": "none"}}, "required": ["action"]},
            "else": {"required": ["after"]},
        }


IDLE = Record(
    IdleRule,
    (
        Field(
            "after",
            Duration(minimum=MIN_IDLE_SECONDS, maximum=MAX_IDLE_SECONDS),
            "How long all of a job's GPUs must stay under the threshold before the job "
            "is an idle holder (like 30m or 2h).",
            attr="after_seconds",
        ),
        Field(
            "action",
            Enum("warn", "release", "none"),
            "warn: show the idle holder in status and the agent's log; release: also "
            "release its GPUs (recorded in history with the reason); none: exempt the job "
            "from its pool's rule.",
        ),
        Field(
            "threshold_percent",
            Number(above=0, maximum=100),
            "A GPU is idle while its NVML utilization is under this percentage.",
        ),
        Field(
            "busy_cpu_percent",
            Number(above=0, maximum=100),
            "Optional: a sample where the job's worker processes used at least this "
            "percentage of the host's CPU time counts as busy, whatever its GPUs show "
            "(a data-loading or checkpoint phase). Unset: only the GPUs count.",
        ),
    ),
    description="When a job holding GPUs counts as idle, and what happens then. A job's "
    "rule overrides its host's pool's. GPUs whose utilization NVML cannot measure never "
    "count as idle.",
    rules=(AfterUnlessExempt(),),
)
