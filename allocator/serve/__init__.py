"""``allocator serve``: a read-only status page, JSON API and fleet metrics.

Optional: it needs the ``serve`` extra (starlette, uvicorn, prometheus-client),
imported only by the ``serve`` command.
"""

__all__: list[str] = []
