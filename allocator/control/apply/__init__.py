"""``policy apply``: one attempt (``policy.py``), the hosts a change can affect (``scope.py``),
the compiled form (``compiled.py``) and the per-host shares (``shares.py``) stored with it.

Each part takes the store, or the narrow :class:`~allocator.control.writer.Writes`, never the
client that calls it.
"""

__all__: list[str] = []
