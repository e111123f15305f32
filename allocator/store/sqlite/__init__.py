"""The embedded SQLite store (``sqlite:///path``): one file shared by the processes of one host."""

__all__: list[str] = []
