"""GPU inventory, health and worker-environment rendering."""

__all__: list[str] = []
