"""Assignment history: the streams kept in the store, appending to them, reading, pruning, usage.

Below the write path and the status readers alike: it imports the store, the records and the
policy's settings only, so both may use it.
"""

__all__: list[str] = []
