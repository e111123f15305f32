"""Warnings: policies that load, but contain something that is almost surely a mistake.

``policy validate`` prints each as ``allocator: warning: file:line: field:
...`` and still exits 0, unless ``--strict``. They are kept apart from the
loader's errors because each can be intended (a reservation left in the file
after it ended is harmless), and one of them depends on the time of the check.
Pure: the policy, the lines the reader recorded and the time are passed in.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from datetime import UTC, datetime

from allocator.errors import placed_fields, placed_text
from allocator.gpus.vendors.registry import VISIBILITY_VARIABLES
from allocator.policy.globs import glob_matches_every_name
from allocator.policy.history_field import STORE_QUOTA_BYTES, size_text
from allocator.policy.model import Policy, Reservation
from allocator.policy.references import referenced_names
from allocator.policy.sharing_field import SHARED

__all__ = ["PolicyWarning", "policy_warnings"]


@dataclass(frozen=True, slots=True)
class PolicyWarning:
    """One warning, placed like a :class:`allocator.errors.PolicyError`."""

    file: str
    line: int | None
    field: str | None
    reason: str

    def __str__(self) -> str:
        return placed_text(self.file, self.line, self.field, self.reason)

    def to_dict(self) -> dict[str, str | int | None]:
        """JSON-ready form (the shape of ``PolicyError.to_dict``)."""
        fields = placed_fields(self.file, self.line, self.field, self.reason)
        return {**fields, "warning": str(self)}


def policy_warnings(
    policy: Policy, source: str, lines: dict[str, int], origins: dict[int, str], now: datetime
) -> tuple[PolicyWarning, ...]:
    """Every warning about ``policy``, in line order.

    ``lines`` maps field paths to lines and ``origins`` model objects (by id)
    to their paths, as the reader recorded them.
    """
    found: list[tuple[str, str]] = []
    found += _reservation_warnings(policy, origins, now)
    found += _case_warnings("jobs", list(policy.jobs), "job", _JOB_CASE)
    found += _case_warnings("hosts", list(policy.hosts), "host", _HOST_CASE)
    found += _host_name_warnings(policy)
    found += _sharing_warnings(policy)
    found += _history_size_warnings(policy)
    found += _reference_warnings(policy)
    warnings = [PolicyWarning(source, lines.get(path), path, reason) for path, reason in found]
    return tuple(sorted(warnings, key=lambda w: (w.line or 0, w.field or "")))


def _reservation_warnings(
    policy: Policy, origins: dict[int, str], now: datetime
) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for reservation in policy.reservations:
        path = origins.get(id(reservation), "reservations")
        if reservation.until is not None and reservation.until <= now:
            found.append(
                (
                    f"{path}.until",
                    f"reservation {reservation.name!r} ended at {_iso(reservation.until)}; "
                    "it reserves nothing any more (remove it)",
                )
            )
        found += _glob_warnings(policy, reservation, path)
    return found


def _glob_warnings(policy: Policy, reservation: Reservation, path: str) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for index, pattern in enumerate(reservation.for_jobs):
        where = f"{path}.for[{index}]"
        if glob_matches_every_name(pattern):
            found.append(
                (
                    where,
                    f"glob {pattern!r} matches every job, so reservation "
                    f"{reservation.name!r} keeps its GPUs from no one",
                )
            )
        elif policy.jobs and not any(fnmatch.fnmatchcase(job, pattern) for job in policy.jobs):
            declared = ", ".join(sorted(policy.jobs)[:5]) + (
                ", ..." if len(policy.jobs) > 5 else ""
            )
            found.append(
                (where, f"glob {pattern!r} matches no job declared under jobs ({declared})")
            )
    return found


_JOB_CASE = "people, and file systems that ignore case (for log files), take them for one"
_HOST_CASE = "host names ignore case (DNS), so they name one machine"


def _case_warnings(section: str, names: list[str], what: str, why: str) -> list[tuple[str, str]]:
    """Names equal but for case: one machine or one log file to anything case-insensitive."""
    first: dict[str, str] = {}
    found: list[tuple[str, str]] = []
    for name in names:
        other = first.setdefault(name.lower(), name)
        if other != name:
            found.append(
                (
                    f"{section}.{name}",
                    f"{what} {name!r} differs from {other!r} only in case; {why}",
                )
            )
    return found


def _host_name_warnings(policy: Policy) -> list[tuple[str, str]]:
    """Hosts the default ``host=`` (and the agent's default host) can never be."""
    found: list[tuple[str, str]] = []
    for name in policy.hosts:
        if "." in name.strip("."):
            short = name.split(".")[0]
            found.append(
                (
                    f"hosts.{name}",
                    f"host {name!r} has a dot, but the agent and `allocator set` default to the "
                    f"short host name ({short!r}): name it {short!r}, or always give host= "
                    "and set host: in the agent's config",
                )
            )
    return found


def _sharing_warnings(policy: Policy) -> list[tuple[str, str]]:
    """``sharing: shared`` still loads, but it neither limits nor tells jobs their share."""
    return [
        (
            f"pools.{name}.sharing",
            "sharing: shared is deprecated; it means time-slicing without a limit, so no "
            "job is told its share: write {mode: time-slice, slots: N} (or mode: mps)",
        )
        for name, pool in policy.pools.items()
        if pool.sharing == SHARED
    ]


def _history_size_warnings(policy: Policy) -> list[tuple[str, str]]:
    """A history cap raised past half of etcd's default quota: only safe with a larger quota."""
    if policy.history.max_bytes <= STORE_QUOTA_BYTES // 2:
        return []
    return [
        (
            "history.max_bytes",
            f"{size_text(policy.history.max_bytes)} of history is more than half of etcd's "
            f"default {STORE_QUOTA_BYTES // 1024**3} GiB quota, past which it refuses every "
            "write: run etcd with a larger --quota-backend-bytes, or lower history.max_bytes",
        )
    ]


#: What the agent sets in a worker's environment (besides the job's env), for ``$(NAME)``.
_WORKER_NAMES = frozenset(
    {
        *VISIBILITY_VARIABLES,
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
    }
)
_WORKER_PREFIXES = ("ALLOCATOR_", "CUDA_MPS_")


def _reference_warnings(policy: Policy) -> list[tuple[str, str]]:
    """``$(NAME)`` in a command where no worker of the job gets NAME: left as written."""
    found: list[tuple[str, str]] = []
    for job in policy.jobs.values():
        for index, argument in enumerate(job.command):
            for name in referenced_names(argument):
                if name in job.env or name in _WORKER_NAMES or name.startswith(_WORKER_PREFIXES):
                    continue
                found.append(
                    (
                        f"jobs.{job.name}.command[{index}]",
                        f"$({name}) names no variable of the job's workers, so it is left as "
                        f"written (set it in env:, or write $$({name}) for the text)",
                    )
                )
    return found


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
