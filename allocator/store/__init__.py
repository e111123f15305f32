"""Store backends, chosen by URL.

``open_store(url)`` imports only the backend the URL names, so a command
talking to SQLite never loads an etcd or Consul client. etcd is reached
through its JSON gateway (:mod:`allocator.store.etcd.store`) by every
caller: CLI commands, the agent, ``serve`` and library users. URL parsing
and redaction live in :mod:`allocator.store.urls`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from pathlib import Path

from allocator.store.base import (
    MAX_TXN_OPS,
    MAX_VALUE_BYTES,
    Compare,
    Delete,
    Event,
    KeyValue,
    Listing,
    Op,
    Put,
    Read,
    Store,
    TxnOutcome,
    Watch,
    bad_key_records,
    key_or_none,
    key_text,
    txn_size,
)
from allocator.store.urls import redact_url, scheme_of

__all__ = [
    "MAX_TXN_OPS",
    "MAX_VALUE_BYTES",
    "Compare",
    "Delete",
    "Event",
    "KeyValue",
    "Listing",
    "Op",
    "Put",
    "Read",
    "Store",
    "TxnOutcome",
    "Watch",
    "bad_key_records",
    "default_store_url",
    "key_or_none",
    "key_text",
    "open_store",
    "redact_url",
    "resolve_store_url",
    "store_username",
    "txn_size",
]

# scheme -> "module:factory"; each factory takes the URL string and ``create``.
_BACKENDS = {
    "sqlite": "allocator.store.sqlite.store:open_sqlite",
    "memory": "allocator.store.memory:open_memory",
    "etcd": "allocator.store.etcd.store:open_etcd",
    "etcds": "allocator.store.etcd.store:open_etcd",
    "consul": "allocator.store.consul.store:open_consul",
    "consuls": "allocator.store.consul.store:open_consul",
}


def default_store_url() -> str:
    """Return the default SQLite URL under the user's state directory."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return f"sqlite://{Path(state) / 'allocator' / 'store.db'}"


def resolve_store_url(explicit: str | None) -> str:
    """Pick the store URL: ``--store``, then ``ALLOCATOR_STORE``, then the default.

    Any password or token the URL carries is remembered, so it is masked in
    every later log line and kept from worker environments.
    """
    from allocator.store.credentials import remember_url

    url = explicit or os.environ.get("ALLOCATOR_STORE") or default_store_url()
    remember_url(url)
    return url


def open_store(url: str, *, create: bool = False) -> Store:
    """Open the backend named by ``url``'s scheme.

    Only a write creates a store that does not exist (only SQLite can be
    missing): a read of a missing SQLite file is ``StoreUnavailable`` naming
    the path, unless ``create`` (the caller is about to create the store,
    like ``policy apply``), when it reads as an empty store. Raises
    ``StoreConfigError`` for a malformed URL or an unknown scheme, with the
    URL's secrets masked.
    """
    from allocator.store.credentials import remember_url

    remember_url(url)
    scheme = scheme_of(url)
    module_name, factory_name = _BACKENDS[scheme].split(":")
    module = importlib.import_module(module_name)
    store: Store = getattr(module, factory_name)(url, create=create)
    return store


def store_username(url: str, env: Mapping[str, str] | None = None) -> str | None:
    """The user ``url``'s store authenticates the client as, where its store has one.

    etcd: the user in the URL or ``ETCDCTL_USER`` (``env``, else the
    process's environment). Consul ACL tokens carry no user name and SQLite
    has no users: ``None``; a malformed etcd URL names none either.
    """
    if not url.startswith(("etcd://", "etcds://")):
        return None
    from allocator.errors import StoreConfigError
    from allocator.store.etcd.config import parse_etcd_url

    try:
        return parse_etcd_url(url, env).username or None
    except StoreConfigError:
        return None
