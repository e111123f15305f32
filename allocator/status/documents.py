"""The JSON documents read commands print with ``-o json`` (and a web API may serve).

One function per document, so every place that shows the same thing shows
it in the same shape; each shape is described by a JSON Schema under
``docs/schemas/``, and the tests check real output against it. The rules
every document follows:

* something absent is ``null``, never the table's ``-`` or an empty string;
* times are RFC 3339 (UTC, ``Z``);
* GPU ids are strings (``"0"``, ``"cpu"``): a MIG instance is no integer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # status pulls in placement and the policy, which history does not need
    from allocator.history.stream import Stored
    from allocator.status.join import GroupStatus, HostStatus

__all__ = [
    "history_document",
    "history_entry_document",
    "status_document",
    "status_host_document",
    "status_host_json",
    "status_json",
]


def status_document(
    hosts: Iterable[HostStatus],
    revision: int,
    groups: Iterable[GroupStatus] = (),
    queue: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """``allocator status -o json``: every host, its GPUs and holders, its jobs, and
    every job across several hosts shown as one; ``queue`` (the waiting requests, as
    ``allocator queue -o json`` lists them) only when some wait."""
    document = {
        "hosts": [h.to_dict() for h in hosts],
        "jobs_across_hosts": [g.to_dict() for g in groups],
        "revision": revision,
    }
    if queue:
        document["queue"] = list(queue)
    return document


def status_host_document(host: HostStatus) -> dict[str, Any]:
    """One host of ``status -o json``: an item of its ``hosts``."""
    return host.to_dict()


def status_host_json(host: HostStatus) -> bytes:
    """One host of ``status -o json``, written as it appears inside the document.

    Sorted keys, indented by two from the depth of the ``hosts`` items: what
    :func:`status_json` puts together, host by host, while the rest is read.
    """
    import msgspec

    # The rows are the document's shape already (None where a field says nothing):
    # written from the structs in one call, with no dict of each row on the way.
    text = msgspec.json.format(msgspec.json.encode(host, order="sorted"), indent=2)
    return b"    " + text.replace(b"\n", b"\n    ")  # no raw line break inside a JSON string


def status_json(
    hosts: Sequence[bytes],
    revision: int,
    groups: Iterable[GroupStatus] = (),
    queue: Sequence[dict[str, Any]] = (),
) -> list[bytes] | None:
    """``status -o json`` from its hosts as :func:`status_host_json` wrote them, in pieces.

    Joined, byte for byte what the CLI writes for :func:`status_document`
    (pieces: a fleet's document is megabytes, better not copied again).
    ``None`` when that is not plain ASCII (the CLI then writes it with every
    character past ASCII escaped) or there is no host.
    """
    import msgspec

    empty: dict[str, Any] = {
        "hosts": [],
        "jobs_across_hosts": [g.to_dict() for g in groups],
        "revision": revision,
    }
    if queue:
        empty["queue"] = list(queue)
    frame = msgspec.json.format(msgspec.json.encode(empty, order="sorted"), indent=2)
    if not hosts or not all(p.isascii() and b"\x7f" not in p for p in (frame, *hosts)):
        return None
    head, tail = frame.split(b'"hosts": []', 1)
    pieces = [head + b'"hosts": [\n']
    for host in hosts:
        pieces += (host, b",\n")
    pieces[-1] = b"\n  ]" + tail + b"\n"
    return pieces


def history_document(entries: Iterable[Stored]) -> dict[str, Any]:
    """``allocator history -o json``: entries, newest first."""
    return {"entries": [history_entry_document(stored) for stored in entries]}


def history_entry_document(stored: Stored) -> dict[str, Any]:
    """One history entry: when, who, what, from where to where, why."""
    entry = stored.entry
    document: dict[str, Any] = {
        "seq": entry.seq,
        "revision": stored.revision,
        "at": entry.at,
        "by": entry.by,
        "action": entry.action,
        "host": entry.host,
        "job": entry.job,
        "from": _place(entry.from_mode, entry.from_gpus),
        "to": _place(entry.to_mode, entry.to_gpus),
        "reason": entry.reason or None,
        "detail": entry.detail or None,
        "policy_sha256": entry.policy_sha256,
        "previous_sha256": entry.previous_sha256,
    }
    # The end of a command `allocator run` held GPUs for (expired: exit status unknown).
    if entry.exit_status is not None or entry.gpu_seconds is not None:
        document["ended"] = {"exit_status": entry.exit_status, "gpu_seconds": entry.gpu_seconds}
    return document


def _place(mode: str | None, gpus: Sequence[int]) -> dict[str, Any] | None:
    if mode is None:
        return None
    return {"mode": mode, "gpus": [str(gpu) for gpu in gpus]}
