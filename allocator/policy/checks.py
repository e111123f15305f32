"""Checks across sections of a policy, run once every field has been read.

They see the fields that could be read (as model objects) plus every name
that was declared, so an entry that was itself invalid is not reported a
second time wherever it is referenced. They also normalise pool
membership: a host listed by a pool gets that pool, and a pool gets every
host that names it, so both spellings give the same :class:`Policy`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from allocator.gpus.vendors.registry import VENDORS
from allocator.policy.history_field import check_history_size
from allocator.policy.model import Host, Job, Pool, Reservation
from allocator.policy.quotas_spec import check_quotas
from allocator.policy.yamlspec.reader import Reader
from allocator.util.durations import duration_text

__all__ = ["MAX_FLEET_GPUS", "check_policy"]


def check_policy(values: dict[str, Any], r: Reader) -> dict[str, Any]:
    """Report cross-reference problems in ``values`` and return them normalised."""
    hosts: dict[str, Host] = values.get("hosts", {})
    pools: dict[str, Pool] = values.get("pools", {})
    members = _check_pool_members(pools, r)
    _check_host_pools(hosts, members, r)
    _check_pool_times(pools, r)
    _check_fleet_size(hosts, r)
    _check_reservations(values.get("reservations", ()), hosts, r)
    _check_jobs(values.get("jobs", {}), r)
    _check_apple_containers(values.get("jobs", {}), hosts, pools, members, r)
    check_quotas(values, r)
    check_history_size(values, r)
    if hosts or pools:
        values["hosts"], values["pools"] = _normalise_pools(hosts, pools, members)
    return values


#: GPUs all declared hosts may have together: every host the bound allows with 8
#: GPUs each (200,000 GPUs are the largest training clusters), so that what
#: ``status`` reads of the whole fleet stays bounded.
MAX_FLEET_GPUS = 262_144


def _check_fleet_size(hosts: dict[str, Host], r: Reader) -> None:
    total = sum(host.gpus for host in hosts.values())
    if total > MAX_FLEET_GPUS:
        r.error_on(
            "hosts",
            f"the hosts declare {total:,} GPUs together; at most {MAX_FLEET_GPUS:,} in one policy",
        )


def _known(r: Reader, section: str) -> str:
    names = r.declared.get(section, [])
    return ", ".join(sorted(names)) if names else "none"


def _check_pool_members(pools: dict[str, Pool], r: Reader) -> dict[str, tuple[str, str]]:
    """Return host -> (pool, path listing it); report unknown hosts and hosts in two pools."""
    declared = set(r.declared.get("hosts", []))
    members: dict[str, tuple[str, str]] = {}
    for pool in pools.values():
        for index, host in enumerate(pool.hosts):
            path = r.item_path(f"pools.{pool.name}.hosts", index)
            if host not in declared:
                r.error_on(path, f"unknown host {host!r} (declared: {_known(r, 'hosts')})")
            elif host in members:
                other, other_path = members[host]
                r.error_on(
                    path,
                    f"host {host!r} is already in pool {other!r} (line {r.lines.get(other_path)}); "
                    "a host belongs to one pool",
                )
            else:
                members[host] = (pool.name, path)
    return members


def _check_pool_times(pools: dict[str, Pool], r: Reader) -> None:
    """A pool's default time limit must fit under its maximum: every job would be refused."""
    for pool in pools.values():
        if pool.default_time is None or pool.max_time is None:
            continue
        if pool.default_time > pool.max_time:
            r.error_on(
                f"pools.{pool.name}.default_time",
                f"default_time {duration_text(pool.default_time)} is above max_time "
                f"{duration_text(pool.max_time)}",
            )


def _check_host_pools(
    hosts: dict[str, Host], members: dict[str, tuple[str, str]], r: Reader
) -> None:
    declared = set(r.declared.get("pools", []))
    for host in hosts.values():
        if host.pool is None:
            continue
        path = f"hosts.{host.name}.pool"
        listed = members.get(host.name)
        if host.pool not in declared:
            r.error_on(path, f"unknown pool {host.pool!r} (defined: {_known(r, 'pools')})")
        elif listed is not None and listed[0] != host.pool:
            r.error_on(
                path,
                f"host {host.name!r} says pool {host.pool!r} but pool {listed[0]!r} "
                f"lists it (line {r.lines.get(listed[1])})",
            )


def _normalise_pools(
    hosts: dict[str, Host], pools: dict[str, Pool], members: dict[str, tuple[str, str]]
) -> tuple[dict[str, Host], dict[str, Pool]]:
    new_hosts = {
        name: msgspec.structs.replace(host, pool=host.pool or members[name][0])
        if name in members
        else host
        for name, host in hosts.items()
    }
    new_pools: dict[str, Pool] = {}
    for name, pool in pools.items():
        listed = set(pool.hosts)  # a set: a pool may list 12,500 hosts
        joined = [h.name for h in new_hosts.values() if h.pool == name and h.name not in listed]
        new_pools[name] = msgspec.structs.replace(pool, hosts=(*pool.hosts, *joined))
    return new_hosts, new_pools


def _check_reservations(
    reservations: tuple[Reservation, ...], hosts: dict[str, Host], r: Reader
) -> None:
    first_by_name: dict[str, str] = {}
    sound: dict[str, list[tuple[Reservation, str]]] = {}  # by host: only those can overlap
    for reservation in reservations:
        path = r.origins[id(reservation)]
        ok = _check_reservation(reservation, path, hosts, r)
        first = first_by_name.setdefault(reservation.name, path)
        if first != path:
            r.error_on(
                f"{path}.name",
                f"duplicate reservation name {reservation.name!r} "
                f"(first at line {r.lines.get(first + '.name')})",
            )
        if ok:
            earlier = sound.setdefault(reservation.host, [])
            _check_overlaps(reservation, path, earlier, r)
            earlier.append((reservation, path))


def _check_reservation(
    reservation: Reservation, path: str, hosts: dict[str, Host], r: Reader
) -> bool:
    """Report problems of one reservation; return whether it can be compared with others."""
    ok = True
    if reservation.host not in r.declared.get("hosts", []):
        r.error_on(
            f"{path}.host",
            f"unknown host {reservation.host!r} (declared: {_known(r, 'hosts')})",
        )
        ok = False
    host = hosts.get(reservation.host)
    if host is not None:
        for index, gpu in enumerate(reservation.gpus):
            if gpu >= host.gpus:
                has = (
                    f"which has {host.gpus} GPUs (0-{host.gpus - 1})"
                    if host.gpus
                    else "which has no GPUs"
                )
                r.error_on(
                    r.item_path(f"{path}.gpus", index),
                    f"GPU {gpu} is not on host {host.name!r}, {has}",
                )
                ok = False
    start, until = reservation.start, reservation.until
    if start is not None and until is not None and until <= start:
        r.error_on(
            f"{path}.until",
            f"until ({_iso(until)}) must be after start ({_iso(start)})",
        )
        ok = False
    return ok


def _check_overlaps(
    reservation: Reservation, path: str, earlier: list[tuple[Reservation, str]], r: Reader
) -> None:
    for other, other_path in earlier:
        if other.host != reservation.host or not _windows_overlap(reservation, other):
            continue
        shared = sorted(set(reservation.gpus) & set(other.gpus))
        if shared:
            gpus = ", ".join(str(gpu) for gpu in shared)
            r.error_on(
                f"{path}.gpus",
                f"GPU {gpus} on host {reservation.host!r} is also reserved by {other.name!r} "
                f"(line {r.lines.get(other_path)}) in an overlapping window",
            )


def _windows_overlap(a: Reservation, b: Reservation) -> bool:
    """Whether the half-open windows [start, until) meet; a missing end is unbounded."""
    a_before_b_ends = a.start is None or b.until is None or a.start < b.until
    b_before_a_ends = b.start is None or a.until is None or b.start < a.until
    return a_before_b_ends and b_before_a_ends


def _iso(value: Any) -> str:
    return str(value.isoformat().replace("+00:00", "Z"))


def _check_apple_containers(
    jobs: dict[str, Job],
    hosts: dict[str, Host],
    pools: dict[str, Pool],
    members: dict[str, tuple[str, str]],
    r: Reader,
) -> None:
    """A container job in a fleet of Apple hosts only could never run: no engine on
    macOS passes the GPU through (on a mixed fleet the agent refuses it on a Mac)."""

    def vendor(name: str, host: Host) -> str | None:
        pool = host.pool or members.get(name, ("", ""))[0]
        return host.vendor or (pools[pool].vendor if pool in pools else None)

    def passes_gpus_through(name: str, host: Host) -> bool:
        devices = VENDORS.get(vendor(name, host) or "")
        return devices is None or bool(devices.cdi_kind)

    if not hosts or any(passes_gpus_through(name, host) for name, host in hosts.items()):
        return
    for job in jobs.values():
        if job.container is not None:
            r.error_on(
                f"{r.origins[id(job)]}.container",
                "every host is an Apple one, and no container engine passes an Apple GPU "
                "through; run the job without container:",
            )


def _check_jobs(jobs: dict[str, Job], r: Reader) -> None:
    rules = r.declared.get("fallback", [])
    for job in jobs.values():
        path = r.origins[id(job)]
        if job.fallback is not None and job.fallback not in rules:
            r.error_on(
                f"{path}.fallback",
                f"unknown fallback rule {job.fallback!r} (defined: {_known(r, 'fallback')})",
            )
        if job.allow_adhoc_command and job.user in (None, "root", "0"):
            r.error_on(
                f"{path}.user" if f"{path}.user" in r.lines else f"{path}.allow_adhoc_command",
                "a job with allow_adhoc_command: true must name a non-root user: whoever can "
                "write an assignment chooses the command it runs",
            )
        if job.restart_backoff_max_seconds < job.restart_backoff_seconds:
            where = f"{path}.restart_backoff_max_seconds"
            if where not in r.lines:
                where = f"{path}.restart_backoff_seconds"
            r.error_on(
                where,
                f"restart_backoff_max_seconds ({job.restart_backoff_max_seconds:g}) must be >= "
                f"restart_backoff_seconds ({job.restart_backoff_seconds:g})",
            )
