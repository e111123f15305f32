"""Fleet-level Prometheus series of ``allocator serve``, from the status it shows (pure).

The agents export their hosts' live numbers; these are what the store says
about the whole fleet: GPUs by state per host, agents by liveness, idle
holders, processes on GPUs nobody was given, and whether ``serve`` itself
reaches the store.

:func:`fleet_families` makes them from a whole fleet's status at once; what
``serve`` answers is kept host by host (:func:`allocator.serve.fleet_api.metrics_text`)
and must equal it.
"""

from __future__ import annotations

from collections.abc import Sequence

from allocator.status.join import HostStatus
from allocator.status.metrics import Family

__all__ = ["AGENT_STATES", "fleet_families"]

#: Every agent state ``status`` knows (each gets a series, zero or not).
AGENT_STATES = ("alive", "stale", "unleased", "gone", "none")


def fleet_families(
    hosts: Sequence[HostStatus], store_up: bool, unreachable_seconds: float
) -> list[Family]:
    """Every fleet series for ``hosts`` (one ``build_status``)."""
    gpus: list[tuple[tuple[str, ...], float]] = []
    strays: list[tuple[tuple[str, ...], float]] = []
    idle: list[tuple[tuple[str, ...], float]] = []
    agents = dict.fromkeys(AGENT_STATES, 0)
    holders = 0
    for host in hosts:
        agents[host.agent] = agents.get(host.agent, 0) + 1
        counts = {"assigned": 0, "free": 0, "unhealthy": 0}
        for row in host.gpus:
            if row.gpu == "cpu":
                continue
            held = row.holder not in ("", "-")
            state = "unhealthy" if row.health != "ok" else "assigned" if held else "free"
            counts[state] += 1
            if row.unassigned:
                strays.append(((host.host, row.gpu), float(len(row.unassigned))))
        gpus += [((host.host, state), float(n)) for state, n in counts.items()]
        for job in host.jobs:
            if job.idle_seconds is not None:
                idle.append(((host.host, job.job), job.idle_seconds))
            holders += job.idle_holder
    return [
        Family(
            "allocator_fleet_gpus",
            "gauge",
            "GPUs per host by state, as the store says.",
            ("host", "state"),
            gpus,
        ),
        Family(
            "allocator_fleet_agents",
            "gauge",
            "Host agents by liveness.",
            ("state",),
            [((state,), float(n)) for state, n in agents.items()],
        ),
        Family(
            "allocator_fleet_job_idle_seconds",
            "gauge",
            "How long each idle job's GPUs have been idle, as its agent says.",
            ("host", "job"),
            idle,
        ),
        Family(
            "allocator_fleet_idle_holders",
            "gauge",
            "Jobs idle past their policy's idle rule.",
            (),
            [((), float(holders))],
        ),
        Family(
            "allocator_fleet_unassigned_processes",
            "gauge",
            "Processes on a GPU that no job there was given.",
            ("host", "gpu"),
            strays,
        ),
        Family(
            "allocator_store_up",
            "gauge",
            "1 while allocator serve reaches the store.",
            (),
            [((), 1.0 if store_up else 0.0)],
        ),
        Family(
            "allocator_store_unreachable_seconds",
            "gauge",
            "Seconds since allocator serve last reached the store (0 while it does).",
            (),
            [((), 0.0 if store_up else unreachable_seconds)],
        ),
    ]
