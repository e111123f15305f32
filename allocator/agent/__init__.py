"""The host agent: watches the store, decides which workers should run, and supervises them."""

__all__: list[str] = []
