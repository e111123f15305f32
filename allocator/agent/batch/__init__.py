"""Submitted batch jobs (``allocator submit``): the agent takes their turn and runs them."""

__all__: list[str] = []
