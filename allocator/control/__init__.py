"""The write path: the Allocator client, set and release, jobs across hosts, policy apply, job
index, history.
"""

__all__: list[str] = []
