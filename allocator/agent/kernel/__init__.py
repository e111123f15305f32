"""What the kernel says of this host's processes: /proc, process groups, signals, cgroups.

A leaf of the agent: the supervisor's processes, the GPU care's MPS daemons
and unassigned-use checks, and the store link's saved files all use it, and
none of them needs another for it.
"""

__all__: list[str] = []
