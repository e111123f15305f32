"""The contract suite runs every test against every backend.

Test ids end in ``[memory]``, ``[sqlite]``, ``[etcd]`` or ``[consul]``, so
``pytest tests/contract -k consul`` runs one backend.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from allocator.store import Store, open_store

BACKENDS = ["memory", "sqlite", "etcd", "consul"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The backend under test."""
    name: str = request.param
    return name


@pytest.fixture
def store_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of a fresh (or, for servers, shared but prefix-isolated) store."""
    if backend == "memory":
        return f"memory://{uuid.uuid4().hex}"
    if backend == "sqlite":
        return f"sqlite://{tmp_path / 'store.db'}"
    if backend == "etcd":
        server = request.getfixturevalue("etcd_server")
        return str(server.url)  # type: ignore[attr-defined]
    url: str = request.getfixturevalue("consul_url")
    return url


@pytest.fixture
def opener(store_url: str) -> Callable[[], Store]:
    """Opens another handle on the store under test."""
    return lambda: open_store(store_url)


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """An open store for the backend under test (a new SQLite store reads as empty)."""
    s = open_store(store_url, create=True)
    try:
        yield s
    finally:
        s.close()
