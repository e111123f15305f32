"""Who is acting, for the audit fields of every write (``updated_by``, ``applied_by``).

The operating system's user at the short host name, plus the store's
authenticated user where the store has one (etcd): never ``$LOGNAME`` or
``$USER``, which anyone can set to anything, newlines and terminal escapes
included.
"""

from __future__ import annotations

from collections.abc import Mapping

from allocator.util.identity import clean_name, local_hostname, os_user

__all__ = ["actor", "store_user"]


def store_user(url: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The user the store authenticates the client as, where the URL's store has one.

    etcd: the user in the URL or ``ETCDCTL_USER``. Consul ACL tokens carry no
    user name and SQLite has no users: ``None``.
    """
    if url is None:
        return None
    from allocator.store import store_username

    name = store_username(url, env)
    return clean_name(name) if name else None


def actor(store_url: str | None = None) -> str:
    """``user@host`` for the audit fields of every write, plus the store's user if any.

    ``alice@node1``, or ``alice@node1 (etcd user ops)`` when the store
    authenticated the client as ``ops``.
    """
    who = f"{os_user()}@{clean_name(local_hostname()) or 'unknown'}"
    authenticated = store_user(store_url)
    return f"{who} (etcd user {authenticated})" if authenticated else who
