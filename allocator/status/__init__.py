"""The read path: what the store holds, joined into who holds what, GPU use, JSON documents and
metrics.
"""

__all__: list[str] = []
