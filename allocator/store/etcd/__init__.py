"""The etcd v3 backend (``etcd://``, ``etcds://``)."""

__all__: list[str] = []
