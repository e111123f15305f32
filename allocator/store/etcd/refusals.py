"""Which operation on which key etcd refused, and what to grant.

etcd answers a refused call with a bare "permission denied", naming
neither the key nor the operation, and checks a transaction's every
compare and operation (both branches) before it applies any. So the name
of a refused transaction's key is found on the failure path only, by
asking again, one key at a time, with transactions that apply nothing: no
compare (so the success branch runs) and the one operation in the
failure branch (checked, never run). A plain call names its key itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from allocator.errors import PermissionDenied
from allocator.store.base import Compare, Delete, Op, Put, Read
from allocator.store.etcd.json_api import Json, b64, range_request
from allocator.store.etcd.rules import prefix_range_end

__all__ = ["is_refusal", "named", "probes", "refused_txn"]


def is_refusal(error: PermissionDenied) -> bool:
    """Whether etcd refused a key (not the login: no user, a wrong password)."""
    return str(error).endswith("permission denied")


def named(
    error: PermissionDenied, verb: str, key: str, user: str | None, *, prefix: bool = False
) -> PermissionDenied:
    """``error`` saying what was refused: ``etcd at H refused put KEY (user alice): grant ...``."""
    where = str(error).split(": ", 1)[0]
    need = "read" if verb in ("range", "watch", "compare") else "write"
    span = f"{key} --prefix=true" if prefix else key
    who = f" (user {user})" if user else ""
    return PermissionDenied(
        f"{where} refused {verb} {key}{' (prefix)' if prefix else ''}{who}: "
        f"grant a role of {user or 'this user'} {need} on {span}"
    )


def probes(
    compares: Sequence[Compare], ops: Sequence[Op], reads: Sequence[Read]
) -> Iterator[tuple[str, str, bool, Json]]:
    """(verb, key, prefix, a transaction that applies nothing) for each key a txn touches."""
    for compare in compares:
        yield "compare", compare.key, False, _checked(_range(compare.key, False))
    for op in ops:
        if isinstance(op, Put):
            yield "put", op.key, False, _checked({"request_put": {"key": b64(op.key)}})
        elif isinstance(op, Delete):
            request: Json = {"key": b64(op.key)}
            if op.prefix:
                request["range_end"] = b64(prefix_range_end(op.key.encode()))
            yield "delete", op.key, op.prefix, _checked({"request_delete_range": request})
    for read in reads:
        yield "range", read.key, read.prefix, _checked(_range(read.key, read.prefix))


def refused_txn(
    error: PermissionDenied,
    call: Callable[[Json], object],
    txn: tuple[Sequence[Compare], Sequence[Op], Sequence[Read]],
    user: str | None,
) -> PermissionDenied:
    """``error`` naming the first key of ``txn`` etcd refuses (as it was, if none is now)."""
    if not is_refusal(error):
        return error
    for verb, key, prefix, probe in probes(*txn):
        try:
            call(probe)
        except PermissionDenied as refused:
            if is_refusal(refused):
                return named(error, f"txn {verb}", key, user, prefix=prefix)
            return error
    return error


def _range(key: str, prefix: bool) -> Json:
    return {"request_range": range_request(key, prefix=prefix, values=False, limit=1)}


def _checked(op: Json) -> Json:
    """A transaction etcd checks ``op`` in but never applies it."""
    return {"success": [], "failure": [op]}
