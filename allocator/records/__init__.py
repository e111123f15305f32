"""What is stored and where: the key layout, field types, the strict codec and the record types."""

__all__: list[str] = []
