"""What a process passes on to the processes it starts, beyond what a request carries.

A worker takes on its client's environment, directory, umask, limits,
standard streams and ignored signals (:mod:`allocator.resident.worker`). A
command that starts the user's processes (``run``) must also start them
where the client would have: in its cgroup and namespaces, on its CPUs and
memory nodes, at its niceness and scheduling policy, with its groups,
capabilities, seccomp filters, security label, root directory and audit
identity. A worker cannot take those on (most need privileges it lacks, or
would weaken the server), so it compares them and declines when any differs:
the client then runs the command in its own process, as it would with no
server. Not compared: the I/O priority (``ionice``), which Linux shows in no
file; a command run under ``ionice`` through a server runs at the server's.

All of it is read from ``/proc``: the client is the same user (the server
checked its peer credentials), so its files there are readable.
"""

from __future__ import annotations

import os

from allocator.agent.kernel.procs import stat_fields

__all__ = ["difference", "facts"]

#: Lines of ``/proc/PID/status`` a child inherits.
_STATUS_FIELDS = (
    "Uid", "Gid", "Groups", "NoNewPrivs", "Seccomp", "Seccomp_filters", "CapInh", "CapPrm",
    "CapEff", "CapBnd", "CapAmb", "Cpus_allowed_list", "Mems_allowed_list",
)  # fmt: skip
#: Files of ``/proc/PID`` a child inherits, read whole (absent ones read as absent).
_FILES = ("cgroup", "oom_score_adj", "loginuid", "attr/current")
#: Namespaces a child is started in.
_NAMESPACES = (
    "cgroup",
    "ipc",
    "mnt",
    "net",
    "pid_for_children",
    "time_for_children",
    "user",
    "uts",
)
#: ``/proc/PID/stat``'s fields a child inherits, by their numbers in proc(5).
_STAT_FIELDS = {"nice": 19, "rt_priority": 40, "policy": 41}


def facts(pid: int | str) -> dict[str, str]:
    """What process ``pid`` (or ``"self"``) passes on to its children; ``OSError`` if gone."""
    root = f"/proc/{pid}"
    found: dict[str, str] = {}
    with open(f"{root}/status", encoding="utf-8", errors="replace") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in _STATUS_FIELDS:
                found[name] = value.strip()
    for name in _FILES:
        try:
            with open(f"{root}/{name}", "rb") as file:
                found[name] = file.read().decode("utf-8", "replace").strip()
        except OSError as error:  # no security module: EINVAL; the same on both sides
            found[name] = f"(errno {error.errno})"
    for name in _NAMESPACES:
        try:
            found[f"ns/{name}"] = os.readlink(f"{root}/ns/{name}")
        except FileNotFoundError:
            found[f"ns/{name}"] = "(absent)"
    found["root"] = os.readlink(f"{root}/root")
    with open(f"{root}/stat", encoding="utf-8", errors="replace") as stat:
        fields = stat_fields(stat.read())
    for name, number in _STAT_FIELDS.items():
        found[name] = fields[number - 3]
    return found


def difference(client: int) -> str | None:
    """The first thing process ``client`` would pass on that this process would not; None: none.

    A client that cannot be read (gone, or its files closed to this
    process) differs in everything.
    """
    try:
        theirs = facts(client)
        ours = facts("self")
    except OSError as error:
        return f"cannot read process {client}: {error.strerror or error}"
    for name, value in theirs.items():
        if ours.get(name) != value:
            return name
    return None
