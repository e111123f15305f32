"""SHA-256 without hashlib's start-up cost.

``import hashlib`` loads OpenSSL's libcrypto first, about 2 ms of every
process that imports it, a few percent of a quick command like ``allocator
set``. CPython's own SHA-256 module (``_sha2``, ``_sha256`` before 3.12)
computes the same digest and costs nothing to import; ``hashlib`` is the
fallback where neither exists.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["sha256_hex"]


def _builtin_sha256() -> Callable[[bytes], Any]:
    for name in ("_sha2", "_sha256"):
        try:
            constructor: Callable[[bytes], Any] = importlib.import_module(name).sha256
        except (ImportError, AttributeError):
            continue
        return constructor
    import hashlib

    return hashlib.sha256


_SHA256 = _builtin_sha256()


def sha256_hex(data: bytes) -> str:
    """The SHA-256 of ``data``, as 64 lowercase hex digits."""
    return str(_SHA256(data).hexdigest())
