"""The policy's ``health`` section: how the agent watches its GPUs."""

from __future__ import annotations

from allocator.policy.model import HealthSettings
from allocator.policy.spec_bounds import (
    ARGUMENT,
    DAY,
    HOUR,
    MAX_ARGUMENTS,
    MAX_RESTARTS,
    MAX_XID,
    MAX_XID_ITEMS,
    MIN_HEALTH_INTERVAL,
)
from allocator.policy.yamlspec.kinds import Int, Number
from allocator.policy.yamlspec.structures import Field, ListOf, Record

__all__ = ["HEALTH"]

HEALTH = Record(
    HealthSettings,
    (
        Field(
            "ignored_xids",
            ListOf(
                Int(minimum=0, maximum=MAX_XID),
                unique=True,
                max_items=MAX_XID_ITEMS,
                label="XID",
                collect=frozenset,
            ),
            "XID events caused by applications, not by a failing GPU; they do not mark a GPU bad.",
        ),
        Field(
            "interval_seconds",
            Number(minimum=MIN_HEALTH_INTERVAL, maximum=HOUR, why="an hour"),
            "Seconds between GPU health checks.",
        ),
        Field(
            "recovery_probe",
            ListOf(ARGUMENT, min_items=1, max_items=MAX_ARGUMENTS, label="argument"),
            "Command the agent runs, with only the recovering GPU visible, before it "
            "returns a GPU to service after NVML reports it healthy again (e.g. a script "
            "that creates a CUDA context); it must exit 0 within the timeout. Unset: "
            "NVML's clean checks alone return the GPU.",
        ),
        Field(
            "recovery_probe_timeout_seconds",
            Number(minimum=1, maximum=HOUR, why="an hour"),
            "Hard time limit of one recovery probe; a probe still running is killed "
            "and counts as a failure.",
        ),
        Field(
            "hold_down_seconds",
            Number(minimum=0, maximum=DAY, why="a day"),
            "How long a GPU that was out of service must stay healthy before jobs return "
            "to it; doubles with each further failure (0: no hold-down).",
        ),
        Field(
            "hold_down_max_seconds",
            Number(minimum=0, maximum=DAY, why="a day"),
            "Cap of the hold-down. A GPU in service this long is stable: its failures are "
            "forgotten, and jobs held back by flap_restart_limit return to it.",
        ),
        Field(
            "flap_restart_limit",
            Int(minimum=0, maximum=MAX_RESTARTS),
            "Restarts of a job caused by its GPUs' health (moving off and back) before it "
            "stays in its fallback (on CPU, or stopped) until the GPUs are stable.",
        ),
    ),
    description="GPU health monitoring.",
)
