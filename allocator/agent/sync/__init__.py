"""The agent's link to the store: the store thread, watches, what it publishes and its history
queue.
"""

__all__: list[str] = []
