"""Job names whose name-derived MASTER_PORTs collide (what two jobs on one host used to share)."""

from __future__ import annotations

from allocator.placement.worker_env import default_master_port

__all__ = ["colliding_job_names"]


def colliding_job_names(count: int) -> list[str]:
    """The first ``count`` names ``job<N>`` with the same preferred port (deterministic)."""
    by_port: dict[int, list[str]] = {}
    for n in range(100_000):
        name = f"job{n}"
        names = by_port.setdefault(default_master_port(name), [])
        names.append(name)
        if len(names) == count:
            return names
    raise AssertionError(f"no {count} job names share a port")
