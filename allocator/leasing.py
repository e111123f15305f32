"""``allocator.lease()``: GPUs for this Python process (a notebook, a script).

::

    import allocator

    with allocator.lease(count=1) as grant:
        model.to(grant.device())

The GPUs are taken exactly as ``allocator run`` takes them (the same
transaction as a ``set``, bound to a store lease kept alive by a daemon
thread), and this process's environment gets what the agent gives a worker
(``CUDA_VISIBLE_DEVICES`` and the rest) for the block; leaving the block
releases them, and so does the interpreter's death (the lease expires).
CUDA reads ``CUDA_VISIBLE_DEVICES`` once, when it initialises: a process
that already initialised CUDA is refused, since it would keep seeing the
devices it saw then.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from allocator.errors import RequestError

__all__ = ["Grant", "cuda_initialised", "lease"]


@dataclass(frozen=True)
class Grant:
    """What a lease holds: the job, host and GPUs (host indices), and the environment set."""

    job: str
    host: str
    gpus: tuple[int, ...]
    env: dict[str, str] = field(default_factory=dict)

    def device(self, index: int = 0) -> Any:
        """The torch device of the ``index``-th GPU held (``cpu`` when none is)."""
        import torch

        if not self.gpus:
            return torch.device("cpu")
        if not 0 <= index < len(self.gpus):
            raise IndexError(f"this lease holds {len(self.gpus)} GPU(s), not index {index}")
        return torch.device("cuda", index)  # CUDA numbers the visible devices from 0


def cuda_initialised() -> bool:
    """Whether this process has initialised CUDA through torch (torch is never imported here)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    is_initialized = getattr(cuda, "is_initialized", None)
    return bool(is_initialized()) if callable(is_initialized) else False


@contextmanager
def lease(
    count: int | None = 1,
    gpus: Sequence[int] | None = None,
    host: str | None = None,
    job: str | None = None,
    ttl: float = 15.0,
    *,
    wait: float | None = None,
    store: str | None = None,
    prefix: str | None = None,
) -> Iterator[Grant]:
    """Hold ``count`` GPUs (or exactly ``gpus``) on ``host`` (default: this machine) for the block.

    ``wait``: seconds to wait while they are busy (``ConflictError`` then);
    ``store``/``prefix``: as ``--store``/``--prefix`` (default: the
    environment's, as the CLI). Raises ``RequestError`` if CUDA is already
    initialised in this process.
    """
    if cuda_initialised():
        raise RequestError(
            "CUDA is already initialised in this process, so it would not see the leased "
            "GPUs (CUDA reads CUDA_VISIBLE_DEVICES once): take the lease before any CUDA "
            "call, or restart the kernel"
        )
    allocator = _open(store, prefix)
    try:
        with _held(allocator, count, gpus, host, job, ttl, wait) as grant:
            yield grant
    finally:
        allocator.store.close()


def _open(store: str | None, prefix: str | None) -> Any:
    from allocator.control.client import Allocator
    from allocator.records.keys import DEFAULT_PREFIX, validate_prefix
    from allocator.store import open_store, resolve_store_url

    chosen = validate_prefix(prefix or os.environ.get("ALLOCATOR_PREFIX") or DEFAULT_PREFIX)
    return Allocator(open_store(resolve_store_url(store)), prefix=chosen)


@contextmanager
def _held(
    allocator: Any,
    count: int | None,
    gpus: Sequence[int] | None,
    host: str | None,
    job: str | None,
    ttl: float,
    wait: float | None,
) -> Iterator[Grant]:
    from allocator.cli.env import worker_envs
    from allocator.cli.run import default_job_name
    from allocator.control.leased import let_go
    from allocator.control.waiting import take_waiting
    from allocator.placement.choose import Request
    from allocator.util.identity import local_hostname, os_user

    request = Request(
        job=job or default_job_name(os_user(), os.urandom(2)),
        host=host or local_hostname(),
        gpus=tuple(gpus) if gpus else None,
        count=None if gpus else count,
    )
    reason = f"allocator.lease() in pid {os.getpid()}"
    holding = take_waiting(
        allocator, request, wait=wait, ttl=ttl, reason=reason, launched_by="lease"
    )
    status = 1
    saved: dict[str, str | None] = {}
    try:
        envs, _ = worker_envs(allocator, request.job, request.host)
        env = envs[0]
        saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)
        held = holding.assignment
        yield Grant(held.job, held.host, held.gpus if held.mode == "gpu" else (), dict(env))
        status = 0
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        let_go(allocator, holding, status, "allocator.lease() ended")
