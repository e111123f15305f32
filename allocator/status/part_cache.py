"""The compiled policy's parts a process last joined, kept by name for its next read.

A part's key names the SHA-256 of its content (see
:mod:`allocator.policy.compiled`), so a part kept here is that part
wherever and whenever it is read again. A long-lived reader (``serve``)
then reads only the parts a change made, not the whole compiled policy; a
quick command, which has none kept, reads every part in one range read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from allocator.records.keys import KeyLayout
from allocator.store.base import Read, Store
from allocator.util.digest import sha256_hex

__all__ = ["PARTS", "PartCache"]

#: The most parts read one by one (in one request); more are read as one range.
FEW_PARTS = 32


class PartCache:
    """The parts of the last compiled policy joined, by name (swapped whole: threads may read)."""

    def __init__(self) -> None:
        self._parts: Mapping[str, bytes] = {}

    def read(self, store: Store, layout: KeyLayout, names: Sequence[str]) -> dict[str, bytes]:
        """The parts ``names`` lists that are kept or stored, by name (one read at most)."""
        kept = self._parts
        missing = [name for name in dict.fromkeys(names) if name not in kept]
        if not missing:
            return dict(kept)
        root = layout.compiled_parts_root
        if kept and len(missing) <= FEW_PARTS:
            listings = store.read_many([Read(layout.compiled_part(name)) for name in missing])
            items = [item for listing in listings for item in listing.items]
        else:  # every stored part: this policy's, and the few its previous one does not share
            items = list(store.list(root).items)
        return {**kept, **{item.key[len(root) :]: item.value for item in items}}

    def keep(self, names: Sequence[str], parts: Mapping[str, bytes]) -> None:
        """Keep the parts ``names`` lists (just joined), each checked against its name."""
        self._parts = {name: parts[name] for name in names if sha256_hex(parts[name]) == name}


#: This process's kept parts.
PARTS = PartCache()
