"""What the recipes tests share."""

from __future__ import annotations

import uuid

import pytest

from allocator.store import Store, open_store


@pytest.fixture
def store() -> Store:
    """An empty memory store of this test's own (a module may override it with a filled one)."""
    return open_store(f"memory://{uuid.uuid4().hex}")
