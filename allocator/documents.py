"""The JSON documents read commands print with ``-o json`` (and ``allocator serve`` serves).

One function per document, so the CLI and the web API show the same thing
in the same shape.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # status pulls in placement and the policy
    from allocator.status import GroupStatus, HostStatus

__all__ = ["status_document"]


def status_document(
    hosts: Iterable[HostStatus], revision: int, groups: Iterable[GroupStatus] = ()
) -> dict[str, Any]:
    """``allocator status -o json``: every host, its GPUs and holders, its jobs,
    and every job across several hosts shown as one."""
    return {
        "hosts": [h.to_dict() for h in hosts],
        "jobs_across_hosts": [g.to_dict() for g in groups],
        "revision": revision,
    }
