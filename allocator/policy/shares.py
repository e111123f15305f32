"""The policy split into what every agent needs and what one host needs (pure: no I/O).

An agent needs its own host of the policy, not the fleet's: at 12,500 hosts
the whole policy is megabytes, and every apply used to send it to every
agent. ``policy apply`` therefore stores, next to the policy record:

* the *common* share: the policy without its hosts, its pools' host lists
  and its reservations (jobs, fallback rules, pools' rules, teams, quotas,
  priorities, settings); its size follows the rules, not the fleet;
* one *host* share per host the policy places: the host's entry (if it is
  declared), its pool's name, the reservations on it.

:func:`assemble` puts a common share and a host share back together into a
:class:`Policy` that holds just that host, so the agent's code reads it as
it read the whole policy. Each share's record carries the SHA-256 of its
JSON, so an apply rewrites only the shares its change changes.

Ordering (an agent must never mix a new common share with an old host
share, or the reverse, in a way the applied policy never said): a share
written in the apply's own transaction (``in_txn``) shows only with the
policy it belongs to. Shares too many for one transaction are written in
batches *before* it, and the transaction then rewrites the common share;
:func:`shares_agree` accepts a host share only when it was written with the
common share's policy, before the common share, or in the transaction. A
host share from an apply still in progress (or one that failed) is newer
than the common share and names another policy: the agent keeps its last
good policy until they agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

import msgspec
from msgspec.structs import replace

from allocator.errors import BadRecord
from allocator.policy.compiled import compiled_format
from allocator.policy.model import Host, Policy, Reservation
from allocator.records.codec import decode_record
from allocator.records.shares import PolicyShare, SharesHead
from allocator.util.digest import sha256_hex

__all__ = [
    "HostPart",
    "Shares",
    "assemble",
    "common_part",
    "decode_common",
    "decode_host_part",
    "fleet_size",
    "host_parts",
    "host_policy",
    "share_record",
    "shares_agree",
    "split_policy",
]


class HostPart(msgspec.Struct, frozen=True, omit_defaults=True):
    """What of the policy only one host needs."""

    name: str
    host: Host | None = None  # its entry, when the policy declares it
    pool: str | None = None  # the pool it belongs to
    reservations: tuple[Reservation, ...] = ()


class Shares(msgspec.Struct, frozen=True):
    """A policy's shares: the common one and one per host, by host name.

    Compared as values, not as their JSON: a policy decoded from its
    compiled form encodes its defaults differently from one just loaded.
    """

    common: Policy
    hosts: Mapping[str, HostPart]


def common_part(policy: Policy) -> Policy:
    """``policy`` without what follows the number of hosts, but with their count, rounded.

    The count (:func:`fleet_size`) is what agents pace their idle requests
    by; rounded up to two significant digits, it changes the common share
    (which every agent reads again) only when the fleet grows or shrinks by
    about a tenth, not with each host.
    """
    pools = {name: replace(pool, hosts=()) for name, pool in policy.pools.items()}
    hosts = fleet_size(len(_host_names(policy)))
    return replace(policy, hosts={}, pools=pools, reservations=(), fleet_hosts=hosts)


def fleet_size(hosts: int) -> int:
    """``hosts`` rounded up to two significant digits (12,345 -> 13,000; 7 -> 7)."""
    step = 10 ** max(0, len(str(hosts)) - 2)
    rounded: int = -(-hosts // step) * step
    return rounded


def _host_names(policy: Policy) -> set[str]:
    """Every host the policy declares, names in a pool or reserves."""
    names = set(policy.hosts)
    for pool in policy.pools.values():
        names.update(pool.hosts)
    names.update(reservation.host for reservation in policy.reservations)
    return names


def host_parts(policy: Policy) -> dict[str, HostPart]:
    """One :class:`HostPart` per host the policy declares or names in a pool."""
    pool_of: dict[str, str] = {}
    for pool in policy.pools.values():
        for host in pool.hosts:
            pool_of.setdefault(host, pool.name)
    for name, declared in policy.hosts.items():
        if declared.pool is not None:
            pool_of[name] = declared.pool
    reserved: dict[str, list[Reservation]] = {}
    for reservation in policy.reservations:
        reserved.setdefault(reservation.host, []).append(reservation)
    names = policy.hosts.keys() | pool_of.keys() | reserved.keys()
    return {
        name: HostPart(
            name, policy.hosts.get(name), pool_of.get(name), tuple(reserved.get(name, ()))
        )
        for name in sorted(names)
    }


def split_policy(policy: Policy) -> Shares:
    """``policy``'s shares (what an apply compares, then encodes where they changed)."""
    return Shares(common_part(policy), host_parts(policy))


def share_record(share: Policy | HostPart, policy_sha256: str, *, in_txn: bool = False) -> bytes:
    """The stored record of one share."""
    body = msgspec.json.encode(share)
    record = PolicyShare(
        policy_sha256, sha256_hex(body), compiled_format(), msgspec.Raw(body), in_txn
    )
    return record.to_json()


def _body(raw: bytes, key: str) -> tuple[PolicyShare, bytes] | None:
    """The record and its body, checked; ``None`` for another loader's format."""
    record = decode_record(raw, PolicyShare, key)
    if record.format != compiled_format():
        return None
    body = bytes(record.body)
    if sha256_hex(body) != record.sha256:
        raise BadRecord(key, "the share's body does not match its sha256")
    return record, body


def decode_common(raw: bytes, key: str) -> tuple[PolicyShare, Policy] | None:
    """The common share of a stored record; ``None`` when another format wrote it."""
    found = _body(raw, key)
    if found is None:
        return None
    try:
        return found[0], msgspec.json.decode(found[1], type=Policy)
    except msgspec.MsgspecError as exc:
        raise BadRecord(key, f"not a valid common share: {exc}") from None


def decode_host_part(raw: bytes, key: str, host: str) -> tuple[PolicyShare, HostPart] | None:
    """The host share of a stored record; ``None`` when another format wrote it."""
    found = _body(raw, key)
    if found is None:
        return None
    try:
        part = msgspec.json.decode(found[1], type=HostPart)
    except msgspec.MsgspecError as exc:
        raise BadRecord(key, f"not a valid host share: {exc}") from None
    if part.name != host:
        raise BadRecord(key, f"the share is host {part.name!r}'s, not {host!r}'s")
    return found[0], part


class StoredShare(Protocol):
    """A share as read from the store (a store's ``KeyValue``): the policy never imports one."""

    @property
    def key(self) -> str: ...
    @property
    def value(self) -> bytes: ...
    @property
    def mod_revision(self) -> int: ...


def shares_agree(
    common: PolicyShare, common_revision: int, host: PolicyShare | None, host_revision: int
) -> bool:
    """Whether a host share belongs with this common share (see the module's ordering notes)."""
    if host is None or host.in_txn or host.policy_sha256 == common.policy_sha256:
        return True
    return host_revision < common_revision


def host_policy(
    sha256: str, head: bytes, common: StoredShare, mine: StoredShare, host: str
) -> Policy | None:
    """``host``'s policy from stored shares, if they are the applied policy's (``sha256``).

    ``head``: the shares' head record; only when it names ``sha256`` (its
    apply wrote every share; an apply still writing has marked it) are the
    shares used. ``None`` for shares of another policy or format;
    ``BadRecord`` for one that does not decode or does not fit.
    """
    if decode_record(head, SharesHead, "shares head").policy_sha256 != sha256:
        return None
    found = decode_common(common.value, common.key)
    part = decode_host_part(mine.value, mine.key, host)
    if found is None or part is None:
        return None
    if not shares_agree(found[0], common.mod_revision, part[0], mine.mod_revision):
        return None
    return assemble(found[1], part[1], host)


def assemble(common: Policy, part: HostPart | None, host: str) -> Policy:
    """The policy of one host: ``common`` with ``part`` put back (``BadRecord`` if they differ).

    Checked as the loader checks a whole policy where they meet: the pool
    exists, and each reservation's GPUs are the host's.
    """
    if part is None:
        return common
    pools = dict(common.pools)
    if part.pool is not None:
        pool = pools.get(part.pool)
        if pool is None:
            raise BadRecord(host, f"its share names pool {part.pool!r}, which the policy lacks")
        pools[part.pool] = replace(pool, hosts=(host,))
    hosts = {host: part.host} if part.host is not None else {}
    _check_reservations(part.reservations, part.host, host)
    return replace(common, hosts=hosts, pools=pools, reservations=part.reservations)


def _check_reservations(
    reservations: Iterable[Reservation], declared: Host | None, host: str
) -> None:
    for reservation in reservations:
        if reservation.host != host:
            raise BadRecord(host, f"reservation {reservation.name!r} is {reservation.host}'s")
        if declared is not None and any(g >= declared.gpus for g in reservation.gpus):
            raise BadRecord(host, f"reservation {reservation.name!r} names GPUs it lacks")
