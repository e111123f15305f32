"""The agent's processes: the supervisor and its job states, launching, adoption, state files,
trees, cgroups, users.
"""

__all__: list[str] = []
