"""Small helpers every layer may use: durations, times and identity, printable text, redaction."""

__all__: list[str] = []
