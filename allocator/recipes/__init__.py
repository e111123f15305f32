"""Self-service recipes over the write path: holdings bound to a store lease (``allocator run``,
``allocator.lease()``), waiting for GPUs, the wait queue.

Each recipe takes a :class:`~allocator.recipes.context.Context`, the few calls it makes on a
client, never the client itself; the :class:`~allocator.control.client.Allocator` is one.
"""

__all__: list[str] = []
