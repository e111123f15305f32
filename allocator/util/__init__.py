"""Small helpers every layer may use: durations, times, identity and printable text."""

__all__: list[str] = []
