"""Status filters (``host=``, ``pool=``, ``job=``, ``state=``, ``user=``): parsed, applied (pure).

Like Slurm's ``sinfo``/``squeue`` filters. Every filter takes a comma list;
filters of different keys must all match (AND), the items of one list any
(OR). ``allocator status`` and ``serve``'s status API read them the same way:

* :func:`parse_filter` turns ``{"host": "node[0000-0099]", "state": "free"}``
  into a :class:`StatusFilter` (``InvalidInput``, one line, when a value is
  unusable: the CLI's exit 2);
* :func:`host_matcher` says whether a host name matches the ``host=``
  patterns: a plain name, a glob (``node0*``, ``gpu-?``) or a range
  (``node[0000-0099]``, the policy's own host range syntax). A pattern with
  ``*`` or ``?`` is a glob; one whose brackets hold only digits, ``,`` and
  ``-`` is a range (and must be a valid one); any other bracket is a glob
  set (``node[ab]``);
* :func:`hosts_to_read` picks the hosts a filtered status must read from the
  policy's hosts (``None``: every host), :func:`pool_by_host` maps each host
  to its pool once;
* :func:`gpu_states` gives one GPU row's states, :func:`filter_hosts` trims
  the joined hosts to the rows that match.

``user=`` picks the rows a user holds (the assignment's ``holder``: the
store's authenticated user, else the OS user that took the GPUs). It picks
no hosts to read: who holds what is in every host's assignments, so a
status filtered by user reads the fleet as an unfiltered one does.

GPU states: ``free`` (nobody holds it and it is healthy), ``held`` (a job
holds it), ``idle`` (held, and its holder's GPUs are idle now: the IDLE
column shows a time), ``unhealthy`` (its agent reports it unhealthy),
``fallback`` (held by a job running on CPU by its fallback rule, or the
``cpu`` row of a job the fallback put on CPU).
"""

from __future__ import annotations

import contextlib
import fnmatch
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Final

import msgspec

from allocator.errors import InvalidInput, InvalidName
from allocator.records.keys import validate_name

if TYPE_CHECKING:
    from allocator.policy.model import Policy
    from allocator.status.join import GpuRow, HostStatus, JobRow

__all__ = [
    "FILTER_KEYS",
    "MAX_RANGE_HOSTS",
    "STATES",
    "StatusFilter",
    "filter_hosts",
    "gpu_states",
    "holders_of",
    "host_matcher",
    "hosts_to_read",
    "parse_filter",
    "plain_host_names",
    "pool_by_host",
    "row_holders",
    "split_list",
]

#: The filter keys, as ``allocator status`` takes them.
FILTER_KEYS: Final = ("host", "pool", "job", "state", "user")
#: The GPU states ``state=`` takes (see the module docstring).
STATES: Final = ("free", "held", "idle", "unhealthy", "fallback")
#: The most hosts one ``host=`` range may name (its names are made to match against).
MAX_RANGE_HOSTS: Final = 1_000_000
_GLOB_CHARACTERS = frozenset("*?")
#: Brackets of digits, commas and dashes only: a range (checked as one), never a glob set.
_RANGE_LIKE = re.compile(r"(?:[^\[\]]|\[[0-9,-]*\])*", re.ASCII)


class StatusFilter(msgspec.Struct, frozen=True):
    """What a filtered status shows: every field a tuple of alternatives, ``()`` for any."""

    hosts: tuple[str, ...] = ()  # names, globs, ranges
    pools: tuple[str, ...] = ()
    jobs: tuple[str, ...] = ()
    states: tuple[str, ...] = ()
    users: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        """Whether nothing is filtered."""
        return not (self.hosts or self.pools or self.jobs or self.states or self.users)

    @property
    def trims_rows(self) -> bool:
        """Whether GPU rows are picked within a host (``job=``, ``state=``, ``user=``)."""
        return bool(self.jobs or self.states or self.users)


def parse_filter(words: Mapping[str, str]) -> StatusFilter:
    """The filter of ``key=value`` words already split (keys outside :data:`FILTER_KEYS` ignored).

    ``InvalidInput`` (one line) for an empty value, an unknown state, a bad
    job or pool name, or a host pattern that is neither name, glob nor range.
    """
    hosts = tuple(_checked_pattern(p) for p in _values(words, "host"))
    pools = tuple(_checked_name(p, "pool") for p in _values(words, "pool"))
    jobs = tuple(_checked_name(j, "job") for j in _values(words, "job"))
    states = _values(words, "state")
    for state in states:
        if state not in STATES:
            raise InvalidInput(f"state={state}: not a GPU state (one of {', '.join(STATES)})")
    users = tuple(_checked_name(u, "user") for u in _values(words, "user"))
    return StatusFilter(hosts, pools, jobs, _unique(states), users)


def split_list(raw: str) -> list[str]:
    """``raw``'s comma-separated items; a comma inside brackets (``n[1-4,7]``) does not split."""
    items, depth, start = [], 0, 0
    for index, char in enumerate(raw):
        if char == "[":
            depth += 1
        elif char == "]":
            depth = max(0, depth - 1)
        elif char == "," and depth == 0:
            items.append(raw[start:index])
            start = index + 1
    items.append(raw[start:])
    return items


def _values(words: Mapping[str, str], key: str) -> tuple[str, ...]:
    if key not in words:
        return ()
    items = split_list(words[key])
    if any(not item for item in items):
        raise InvalidInput(f"{key}={words[key]}: an empty item (write {key}=a or {key}=a,b)")
    return _unique(items)


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def _checked_name(name: str, what: str) -> str:
    try:
        return validate_name(name, what)
    except InvalidName as exc:
        raise InvalidInput(f"{what}={name}: {exc}") from None


def _checked_pattern(pattern: str) -> str:
    """``pattern`` if it reads as a host name, glob or range (``InvalidInput`` if not)."""
    from allocator.policy.globs import NAME_CHARACTERS

    kind = _pattern_kind(pattern)
    if kind == "name":
        return _checked_name(pattern, "host")
    if kind == "range":
        from allocator.policy.host_ranges import pattern_count

        try:
            count = pattern_count(pattern)
        except ValueError as exc:
            raise InvalidInput(f"host={pattern}: {exc}") from None
        if count > MAX_RANGE_HOSTS:
            raise InvalidInput(
                f"host={pattern}: names {count:,} hosts; at most {MAX_RANGE_HOSTS:,}"
            )
        return pattern
    allowed = NAME_CHARACTERS | frozenset("*?[]!")
    if not set(pattern) <= allowed or len(pattern) > 255:
        raise InvalidInput(
            f"host={pattern}: not a host name, glob (node0*) or range (node[0000-0099])"
        )
    return pattern


def _pattern_kind(pattern: str) -> str:
    """``name``, ``glob`` or ``range`` (see the module docstring)."""
    if _GLOB_CHARACTERS & set(pattern):
        return "glob"
    if "[" not in pattern and "]" not in pattern:
        return "name"
    return "range" if _RANGE_LIKE.fullmatch(pattern) else "glob"


def plain_host_names(patterns: Sequence[str]) -> tuple[str, ...] | None:
    """The host names ``patterns`` are when every one is a plain name; ``None`` otherwise."""
    if all(_pattern_kind(p) == "name" for p in patterns):
        return tuple(patterns)
    return None


def host_matcher(patterns: Sequence[str]) -> Callable[[str], bool]:
    """Whether a host name matches any of ``patterns`` (checked by :func:`parse_filter`)."""
    names: set[str] = set()
    globs: list[str] = []
    for pattern in patterns:
        kind = _pattern_kind(pattern)
        if kind == "glob":
            globs.append(pattern)
        elif kind == "range":
            from allocator.policy.host_ranges import expand_hosts

            with contextlib.suppress(ValueError):  # it makes names no host may have
                names.update(expand_hosts(pattern, MAX_RANGE_HOSTS))
        else:
            names.add(pattern)

    def matches(host: str) -> bool:
        return host in names or any(fnmatch.fnmatchcase(host, g) for g in globs)

    return matches


def pool_by_host(policy: Policy | None) -> dict[str, str]:
    """Each host's pool name as :meth:`Policy.pool_of` finds it (hosts of no pool left out)."""
    if policy is None:
        return {}
    found: dict[str, str] = {}
    for pool in policy.pools.values():
        for host in pool.hosts:
            found.setdefault(host, pool.name)
    for name, declared in policy.hosts.items():
        if declared.pool is not None:
            if declared.pool in policy.pools:
                found[name] = declared.pool
            else:
                found.pop(name, None)
    return found


def hosts_to_read(
    wanted: StatusFilter,
    declared: Iterable[str],
    pools: Mapping[str, str] | None = None,
    job_hosts: Iterable[str] | None = None,
) -> list[str] | None:
    """The hosts a status filtered by ``wanted`` must read, sorted; ``None``: every host.

    ``declared``: the policy's hosts; ``pools``: :func:`pool_by_host` (only
    needed with ``pool=``); ``job_hosts``: the hosts the job index names for
    ``job=`` (``None``: not known, so every host may hold the job). A plain
    ``host=`` name is read even where the policy does not declare it (its
    agent may still report); patterns match only the policy's hosts.
    """
    picked: set[str] | None = None
    if wanted.hosts:
        plain = plain_host_names(wanted.hosts)
        if plain is not None:
            picked = set(plain)
        else:
            matches = host_matcher(wanted.hosts)
            picked = {h for h in declared if matches(h)}
            picked.update(p for p in wanted.hosts if _pattern_kind(p) == "name")
    if wanted.pools:
        in_pools = {h for h, p in (pools or {}).items() if p in wanted.pools}
        picked = in_pools if picked is None else picked & in_pools
    if wanted.jobs and job_hosts is not None:
        holding = set(job_hosts)
        picked = holding if picked is None else picked & holding
    return None if picked is None else sorted(picked)


def gpu_states(row: GpuRow, holders: Sequence[JobRow] = ()) -> frozenset[str]:
    """The states of one GPU row (see the module docstring); ``holders``: the jobs holding it."""
    states: set[str] = set()
    held = row.holder is not None
    if row.gpu == "cpu":
        return frozenset({"fallback"}) if any(j.fallback for j in holders) else frozenset()
    if held:
        states.add("held")
        if row.idle:
            states.add("idle")
        if any(j.fallback for j in holders):
            states.add("fallback")
    if row.health != "ok":
        states.add("unhealthy")
    elif not held:
        states.add("free")
    return frozenset(states)


def row_holders(host: HostStatus) -> dict[str, list[JobRow]]:
    """The host's jobs by the GPU (``"0"``, ``"cpu"``) they hold."""
    by_gpu: dict[str, list[JobRow]] = {}
    for job in host.jobs:
        for gpu in job.gpus.split(","):
            if gpu:
                by_gpu.setdefault(gpu, []).append(job)
    return by_gpu


def holders_of(row: GpuRow, by_gpu: Mapping[str, Sequence[JobRow]]) -> Sequence[JobRow]:
    """The jobs holding ``row``'s GPU (a ``cpu`` row: its own job), from :func:`row_holders`."""
    jobs = by_gpu.get(row.gpu, ())
    if row.gpu == "cpu":
        return [j for j in jobs if j.job == row.holder]
    return jobs


def filter_hosts(
    hosts: Iterable[HostStatus],
    wanted: StatusFilter,
    pools: Mapping[str, str] | None = None,
) -> list[HostStatus]:
    """``hosts`` that ``wanted`` matches, each with only the GPU rows and jobs that match.

    A host matched by ``host=``/``pool=`` alone is kept whole (also with no
    GPU); with ``job=``, ``state=`` or ``user=``, a host is kept only when one
    of its rows matches, and with only those rows and the jobs holding them
    (for ``job=`` and ``user=``, only those jobs). ``pools``: :func:`pool_by_host`.
    """
    matches = host_matcher(wanted.hosts) if wanted.hosts else None
    kept = []
    for host in hosts:
        if matches is not None and not matches(host.host):
            continue
        if wanted.pools and (pools or {}).get(host.host) not in wanted.pools:
            continue
        if not wanted.trims_rows:
            kept.append(host)
            continue
        trimmed = _trimmed(host, wanted)
        if trimmed is not None:
            kept.append(trimmed)
    return kept


def _trimmed(host: HostStatus, wanted: StatusFilter) -> HostStatus | None:
    """``host`` with only the rows ``job=``/``state=`` pick; ``None`` when none is left."""
    holders = row_holders(host)
    rows = []
    for row in host.gpus:
        jobs = holders_of(row, holders)
        if wanted.jobs and not any(j.job in wanted.jobs for j in jobs):
            continue
        if wanted.states and not gpu_states(row, jobs) & set(wanted.states):
            continue
        if wanted.users and not set((row.user or "").split(",")) & set(wanted.users):
            continue
        rows.append(row)
    if not rows:
        return None
    shown = {row.gpu for row in rows}
    jobs = tuple(
        j
        for j in host.jobs
        if (not wanted.jobs or j.job in wanted.jobs)
        and (not wanted.users or j.user in wanted.users)
        and shown & set(j.gpus.split(","))
    )
    return msgspec.structs.replace(host, gpus=tuple(rows), jobs=jobs)
