"""The command server: the user's resident ``allocator`` that keeps the CLI's modules loaded.

A command spends most of its time importing what it needs (msgspec, h11, the
store client, placement) before it sends its first byte; ``etcdctl``, a Go
binary, needs none of that. The console script (:mod:`allocator.resident.door`)
hands each short command to a per-user server that has those modules loaded
and forks a worker for it (:mod:`allocator.resident.worker`), as Mercurial's
chg and the Gradle daemon do. Where no server answers, the command runs in the
client's own process, as it always did, and a server is started for the next
one. ``ALLOCATOR_SERVER=0`` turns it off; ``python -m allocator`` never uses it.

This package sits above the CLI: the worker runs :func:`allocator.cli.main`.
The door imports nothing but the standard library until it must run a command
itself.
"""

__all__: list[str] = []
