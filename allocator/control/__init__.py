"""The write path: the Allocator client, set and release on one host and across hosts, the
quota counters, the job index, and policy apply (``apply/``).
"""

__all__: list[str] = []
