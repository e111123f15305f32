"""Batch jobs: ``allocator submit`` queues them, the host's agent takes their turn and runs them."""

__all__: list[str] = []
