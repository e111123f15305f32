"""The ``key=value`` grammar of ``set``, ``get``, ``release`` and friends.

Pure functions: they turn words into typed requests or raise
``InvalidInput`` with one line saying what is wrong. No other exception may
escape them (a property test feeds them arbitrary input). Every value has a
maximum length, checked before anything else is done with it: Python's
``int()`` refuses numbers over 4,300 digits with an error of its own, and an
error message must not echo a megabyte back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from msgspec import Struct
from msgspec.structs import replace

from allocator.errors import InvalidInput
from allocator.records.keys import validate_name

__all__ = [
    "MAX_GPU_INDEX",
    "MAX_OTHER_VALUE_LENGTH",
    "MAX_VALUE_LENGTH",
    "SetArgs",
    "parse_gpu_list",
    "parse_host_list",
    "parse_key_values",
    "parse_reason",
    "parse_release_args",
    "parse_set_args",
    "parse_target_args",
]

#: No host has more GPUs than this; bigger numbers are typos.
MAX_GPU_INDEX = 1023
_MAX_COUNT = MAX_GPU_INDEX + 1
_MAX_REASON = 200
#: The longest value each key takes (``gpus=0,1,...,1023`` is 4,014 characters).
MAX_VALUE_LENGTH = {
    "command": 65_536,
    "gpus": 8192,
    "reason": 4096,
    "count": 8,
    "worker": 8,
    "slots": 8,
    "prefer": 16,
}
#: The longest value of any other key (names then say they are at most 63 characters).
MAX_OTHER_VALUE_LENGTH = 1024
_SHOWN = 40


def _shown(text: str) -> str:
    """``text`` cut for an error message."""
    return text if len(text) <= _SHOWN else f"{text[: _SHOWN - 3]}..."


def parse_key_values(words: Iterable[str], allowed: Sequence[str]) -> dict[str, str]:
    """Split ``key=value`` words, refusing unknown, repeated, malformed or overlong ones."""
    result: dict[str, str] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep:
            raise InvalidInput(
                f"expected key=value, got {_shown(word)!r} (keys: {', '.join(allowed)})"
            )
        if key not in allowed:
            import difflib  # only for a mistyped key

            hint = difflib.get_close_matches(key, allowed, n=1) if len(key) <= _SHOWN else []
            suggestion = (
                f"; did you mean {hint[0]!r}?" if hint else f" (keys: {', '.join(allowed)})"
            )
            raise InvalidInput(f"unknown argument {_shown(key)!r}{suggestion}")
        if key in result:
            raise InvalidInput(f"{key}= given twice")
        limit = MAX_VALUE_LENGTH.get(key, MAX_OTHER_VALUE_LENGTH)
        if len(value) > limit:
            raise InvalidInput(f"{key}= is {len(value):,} characters long; at most {limit:,}")
        result[key] = value
    return result


def _parse_index(token: str, raw: str) -> int:
    if not token.isascii() or not token.isdigit():
        raise InvalidInput(
            f"gpus={_shown(raw)}: {_shown(token)!r} is not a GPU index "
            "(use e.g. gpus=0,2 or gpus=0-3)"
        )
    if len(token.lstrip("0")) > len(str(MAX_GPU_INDEX)):  # too long to be an index: no int()
        raise InvalidInput(
            f"gpus={_shown(raw)}: GPU index {_shown(token)} is out of range (0-{MAX_GPU_INDEX})"
        )
    index = int(token)
    if index > MAX_GPU_INDEX:
        raise InvalidInput(
            f"gpus={_shown(raw)}: GPU index {index} is out of range (0-{MAX_GPU_INDEX})"
        )
    return index


def parse_gpu_list(raw: str) -> tuple[int, ...]:
    """Parse ``1,3`` or ``0-3`` (Slurm-style ranges) into distinct indices, in order given."""
    if not raw:
        raise InvalidInput("gpus= is empty (use gpus=0,2, gpus=0-3 or gpus=cpu)")
    indices: list[int] = []
    for part in raw.split(","):
        low, dash, high = part.partition("-")
        if dash:
            first, last = _parse_index(low, raw), _parse_index(high, raw)
            if last < first:
                raise InvalidInput(f"gpus={_shown(raw)}: range {_shown(part)!r} runs backwards")
            indices.extend(range(first, last + 1))
        else:
            indices.append(_parse_index(part, raw))
    seen: set[int] = set()
    for index in indices:
        if index in seen:
            raise InvalidInput(f"gpus={_shown(raw)}: GPU {index} is listed twice")
        seen.add(index)
    return tuple(indices)


def _parse_count(raw: str) -> int:
    if not raw.isascii() or not raw.isdigit():
        raise InvalidInput(f"count={raw}: expected a positive whole number")
    count = int(raw)
    if not 1 <= count <= _MAX_COUNT:
        raise InvalidInput(f"count={raw}: must be between 1 and {_MAX_COUNT}")
    return count


def parse_reason(raw: str) -> str:
    """A ``reason=``: printable, at most 200 characters (it is shown in tables)."""
    if len(raw) > _MAX_REASON:
        raise InvalidInput(f"reason= is {len(raw)} characters; at most {_MAX_REASON}")
    if not raw.isprintable():
        raise InvalidInput("reason= must not contain control characters")
    return raw


class SetArgs(Struct, frozen=True):
    """A parsed ``allocator set``: exactly one of gpus, count or cpu.

    A Struct, not a dataclass: it is defined on every ``set`` start-up.

    ``hosts`` holds the hosts of a job across several hosts (``host=a,b``,
    in node-rank order); ``host`` is then the first of them.
    """

    job: str
    host: str | None
    gpus: tuple[int, ...] | None = None
    count: int | None = None
    cpu: bool = False
    reason: str = ""
    command: tuple[str, ...] | None = None
    hosts: tuple[str, ...] = ()
    time: str | None = None  # time=DURATION as typed: the planner checks it against the pool
    slots: int | None = None
    prefer: Literal["free", "links"] = "free"


def parse_command(raw: str) -> tuple[str, ...]:
    """Split an ad-hoc ``command=`` the way a POSIX shell would."""
    import shlex

    try:
        argv = tuple(shlex.split(raw))
    except ValueError as exc:
        raise InvalidInput(f"command={_shown(raw)!r}: {exc}") from None
    if not argv:
        raise InvalidInput("command= is empty")
    return argv


def parse_set_args(words: Iterable[str]) -> SetArgs:
    """Parse ``job=x (gpus=L | gpus=cpu | count=N) [slots=K] [prefer=links] [host=h[,h2]] ...``."""
    kv = parse_key_values(
        words, ("job", "gpus", "count", "host", "reason", "command", "slots", "prefer", "time")
    )
    hosts = parse_host_list(kv.pop("host")) if "host" in kv else ()
    job, _ = _job_and_host(kv)
    if ("gpus" in kv) == ("count" in kv):
        raise InvalidInput("give exactly one of gpus=LIST, gpus=cpu or count=N")
    base = SetArgs(
        job=job,
        host=hosts[0] if hosts else None,
        hosts=hosts if len(hosts) > 1 else (),
        reason=parse_reason(kv.get("reason", "")),
        command=parse_command(kv["command"]) if "command" in kv else None,
        slots=_parse_slots(kv["slots"]) if "slots" in kv else None,
        prefer=_parse_prefer(kv.get("prefer", "free"), "count" in kv),
        time=kv.get("time"),
    )
    if "count" in kv:
        return replace(base, count=_parse_count(kv["count"]))
    if kv["gpus"] == "cpu":
        if base.slots is not None:
            raise InvalidInput("slots= takes slots of GPUs; gpus=cpu holds none")
        return replace(base, cpu=True)
    return replace(base, gpus=parse_gpu_list(kv["gpus"]))


def parse_host_list(raw: str) -> tuple[str, ...]:
    """Parse ``node1`` or ``node1,node2`` (a job across hosts, in node-rank order)."""
    hosts = tuple(validate_name(name, "host") for name in raw.split(","))
    if len(hosts) == 1:  # the usual case: no need to load what jobs across hosts use
        return hosts
    from allocator.control.across_hosts import MAX_JOB_HOSTS

    repeated = sorted({h for h in hosts if hosts.count(h) > 1})
    if repeated:
        raise InvalidInput(f"host={_shown(raw)}: {repeated[0]} is listed twice")
    if len(hosts) > MAX_JOB_HOSTS:
        raise InvalidInput(
            f"host= names {len(hosts)} hosts; one job spans at most {MAX_JOB_HOSTS} "
            "(every host's share is written in one store transaction)"
        )
    return hosts


def _parse_slots(raw: str) -> int:
    from allocator.records.fields import MAX_SLOTS

    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= MAX_SLOTS:
        raise InvalidInput(f"slots={_shown(raw)}: expected a whole number from 1 to {MAX_SLOTS}")
    return int(raw)


def _parse_prefer(raw: str, counted: bool) -> Literal["free", "links"]:
    if raw not in ("free", "links"):
        raise InvalidInput(f"prefer={_shown(raw)}: expected free or links")
    if raw == "links" and not counted:
        raise InvalidInput("prefer= ranks the GPUs count=N picks; gpus= names them already")
    return "links" if raw == "links" else "free"


def parse_target_args(words: Iterable[str]) -> tuple[str, str | None]:
    """Parse ``job=x [host=h]`` (for get and release); return (job, host)."""
    return _job_and_host(parse_key_values(words, ("job", "host")))


def parse_release_args(words: Iterable[str]) -> tuple[str, str | None, str]:
    """Parse ``job=x [host=h] [reason=...]``; return (job, host, reason)."""
    kv = parse_key_values(words, ("job", "host", "reason"))
    job, host = _job_and_host(kv)
    return job, host, parse_reason(kv.get("reason", ""))


def _job_and_host(kv: dict[str, str]) -> tuple[str, str | None]:
    if "job" not in kv:
        raise InvalidInput("job= is required (e.g. job=train)")
    job = validate_name(kv["job"], "job")
    host = validate_name(kv["host"], "host") if "host" in kv else None
    return job, host
