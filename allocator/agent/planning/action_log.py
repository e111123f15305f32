"""How a planned action reads in the agent's decision log."""

from __future__ import annotations

from typing import Any

from allocator.agent.log import as_fields
from allocator.agent.planning.types import Action, Finish, GiveUp, Start, Stop

__all__ = ["action_fields", "action_name"]


def action_name(action: Action) -> str:
    """The log event name of a planned action (``start``, ``stop``, ...)."""
    return type(action).__name__.lower()


def action_fields(action: Action) -> dict[str, Any]:
    """What a log line says about an action: a Start names GPUs and device, not the spec."""
    fields = as_fields(action)
    if isinstance(action, Start):
        spec = fields.pop("spec")
        fields.update(
            gpus=list(spec.gpus),
            device=spec.device,
            workers=len(spec.workers),
            fallback=spec.fallback_reason,
        )
    if isinstance(action, Stop | GiveUp | Finish):
        fields["reason"] = action.reason
    return fields
