"""The Consul KV backend (``consul://``, ``consuls://``), the one package importing py-consul."""

__all__: list[str] = []
