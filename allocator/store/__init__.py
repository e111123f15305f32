"""Store backends, chosen by URL.

``open_store(url)`` imports only the backend the URL names, so a command
talking to SQLite never loads grpc or requests.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from urllib.parse import urlsplit

from allocator.errors import StoreConfigError
from allocator.store.base import (
    MAX_VALUE_BYTES,
    Compare,
    Delete,
    Event,
    KeyValue,
    Listing,
    Op,
    Put,
    Store,
    Watch,
)

__all__ = [
    "MAX_VALUE_BYTES",
    "Compare",
    "Delete",
    "Event",
    "KeyValue",
    "Listing",
    "Op",
    "Put",
    "Store",
    "Watch",
    "default_store_url",
    "open_store",
    "resolve_store_url",
]

# scheme -> "module:factory"; each factory takes the URL string.
_BACKENDS = {
    "sqlite": "allocator.store.sqlite:open_sqlite",
    "memory": "allocator.store.memory:open_memory",
    "etcd": "allocator.store.etcd:open_etcd",
    "etcds": "allocator.store.etcd:open_etcd",
    "consul": "allocator.store.consul:open_consul",
    "consuls": "allocator.store.consul:open_consul",
}


def default_store_url() -> str:
    """Return the default SQLite URL under the user's state directory."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return f"sqlite://{Path(state) / 'allocator' / 'store.db'}"


def resolve_store_url(explicit: str | None) -> str:
    """Pick the store URL: ``--store``, then ``ALLOCATOR_STORE``, then the default."""
    return explicit or os.environ.get("ALLOCATOR_STORE") or default_store_url()


def open_store(url: str) -> Store:
    """Open the backend named by ``url``'s scheme.

    Raises ``StoreConfigError`` for a malformed URL or unknown scheme.
    """
    scheme = urlsplit(url).scheme if "://" in url else ""
    target = _BACKENDS.get(scheme)
    if target is None:
        known = ", ".join(sorted(f"{s}://" for s in _BACKENDS))
        raise StoreConfigError(f"unknown store URL {url!r}: expected one of {known}")
    module_name, factory_name = target.split(":")
    module = importlib.import_module(module_name)
    store: Store = getattr(module, factory_name)(url)
    return store
