"""The worker shim: the small standard-library program that execs and watches one worker.

Nothing here may import more than the standard library: the shim runs isolated (``-I -S``).
"""

__all__: list[str] = []
