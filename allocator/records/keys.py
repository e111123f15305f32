"""Names and the key layout.

Everything a user types that becomes part of a key goes through
:func:`validate_name`, so nothing can escape its prefix (``../x``, ``a/b``)
or smuggle in characters a backend treats specially.
"""

from __future__ import annotations

import re

from msgspec import Struct

from allocator.errors import InvalidName

__all__ = [
    "DEFAULT_PREFIX",
    "MAX_NAME_LENGTH",
    "KeyLayout",
    "split_host_key",
    "validate_name",
    "validate_prefix",
]

DEFAULT_PREFIX = "/allocator"
MAX_NAME_LENGTH = 63
_NAME = re.compile(r"[A-Za-z0-9._-]+", re.ASCII)
_PREFIX = re.compile(r"(/[A-Za-z0-9._-]+)+", re.ASCII)


def validate_name(value: str, what: str = "name") -> str:
    """Return ``value`` if it is a valid host/job name, else raise ``InvalidName``.

    Allowed: 1-63 ASCII letters, digits, ``.``, ``_``, ``-``; not ``.`` or
    ``..``; not starting with ``-`` (it would read as an option).
    """
    if not value:
        raise InvalidName(f"{what} must not be empty")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidName(f"{what} is {len(value)} characters long; at most {MAX_NAME_LENGTH}")
    if not _NAME.fullmatch(value):
        raise InvalidName(
            f"{what} {value!r} may contain only ASCII letters, digits, '.', '_' and '-'"
        )
    if value in (".", "..") or value.startswith("-"):
        raise InvalidName(f"{what} {value!r} is not allowed")
    return value


def validate_prefix(prefix: str) -> str:
    """Return a normalised key prefix (``/a/b``), or raise ``InvalidName``."""
    cleaned = prefix.rstrip("/")
    if not _PREFIX.fullmatch(cleaned) or any(p in (".", "..") for p in cleaned.split("/")[1:]):
        raise InvalidName(f"key prefix {prefix!r} must look like /name or /name/name")
    return cleaned


class KeyLayout(Struct, frozen=True):
    """Where each record lives under a prefix (default ``/allocator``).

    ``host_generation`` is bumped by every assignment write on that host; a
    transaction compares it, which is how a new key appearing under the host
    between read and write is detected (etcd and Consul cannot compare
    "no new key under a prefix" directly).
    """

    prefix: str = DEFAULT_PREFIX

    @property
    def root(self) -> str:
        """The versioned root every key lives under."""
        return f"{self.prefix}/v1"

    @property
    def policy(self) -> str:
        """The applied policy record."""
        return f"{self.root}/policy"

    @property
    def compiled_policy(self) -> str:
        """The applied policy as its loader built it (see :mod:`allocator.policy.compiled`).

        Not under ``policy``: agents watch that key as a prefix.
        """
        return f"{self.root}/compiled/policy"

    @property
    def compiled_parts_root(self) -> str:
        """Prefix of every compiled policy's parts (trailing slash included)."""
        return f"{self.root}/compiled/parts/"

    def compiled_part(self, part_sha256: str) -> str:
        """One part of a compiled policy too large for one value, named by its SHA-256."""
        return f"{self.compiled_parts_root}{part_sha256}"

    @property
    def shares(self) -> str:
        """Prefix of the policy's shares (see :mod:`allocator.policy.shares`; trailing slash).

        Not under ``policy``: agents of older versions watch that key as a prefix.
        """
        return f"{self.root}/shares/"

    @property
    def common_share(self) -> str:
        """The part of the policy every agent needs (jobs, pools' rules, settings)."""
        return f"{self.shares}common"

    @property
    def shares_head(self) -> str:
        """Which applied policy the shares are complete for (read by ``policy apply``)."""
        return f"{self.shares}head"

    @property
    def host_shares(self) -> str:
        """Prefix of every host's share (trailing slash included)."""
        return f"{self.shares}hosts/"

    def host_share_prefix(self, host: str) -> str:
        """Prefix of one host's share (trailing slash: watching it sees no other host)."""
        return f"{self.host_shares}{validate_name(host, 'host')}/"

    def host_share(self, host: str) -> str:
        """The part of the policy only ``host`` needs: its entry, pool, reservations."""
        return f"{self.host_share_prefix(host)}policy"

    @property
    def hosts(self) -> str:
        """Prefix of every host's keys (trailing slash included)."""
        return f"{self.root}/hosts/"

    def host(self, host: str) -> str:
        """Prefix of one host's keys (trailing slash included)."""
        return f"{self.hosts}{validate_name(host, 'host')}/"

    def host_jobs(self, host: str) -> str:
        """Prefix of a host's assignment keys (trailing slash included)."""
        return f"{self.host(host)}jobs/"

    def assignment(self, host: str, job: str) -> str:
        """Key of one job's assignment on one host."""
        return f"{self.host_jobs(host)}{validate_name(job, 'job')}"

    def host_generation(self, host: str) -> str:
        """Key bumped by every assignment change on ``host``."""
        return f"{self.host(host)}generation"

    @property
    def jobs(self) -> str:
        """Prefix of the job index (trailing slash included)."""
        return f"{self.root}/jobs/"

    def job_index(self, job: str) -> str:
        """Key naming the hosts where ``job`` holds an assignment.

        Written in the same transaction as every assignment change, so finding
        a job reads this one key instead of every host.
        """
        return f"{self.jobs}{validate_name(job, 'job')}"

    @property
    def fleet_generation(self) -> str:
        """Key bumped by every assignment change on any host.

        ``policy apply`` compares it, so an assignment made while the new
        policy was being checked makes the apply retry (and see it) instead
        of landing over it.
        """
        return f"{self.root}/generation"

    @property
    def history(self) -> str:
        """Prefix of every history key (trailing slash included).

        Outside ``hosts/``: ``set`` and ``status`` read a host's whole prefix,
        and a thousand history entries there would slow both.
        """
        return f"{self.root}/history/"

    @property
    def history_heads(self) -> str:
        """Prefix of the per-host history heads (one key per host that has history)."""
        return f"{self.history}heads/hosts/"

    def host_history_head(self, host: str) -> str:
        """Key holding the bounds (first, next sequence number) of ``host``'s history."""
        return f"{self.history_heads}{validate_name(host, 'host')}"

    def host_history(self, host: str) -> str:
        """Prefix of ``host``'s history entries (trailing slash included)."""
        return f"{self.history}hosts/{validate_name(host, 'host')}/"

    @property
    def policy_history_head(self) -> str:
        """Key holding the bounds of the policy's history."""
        return f"{self.history}heads/policy"

    @property
    def policy_history(self) -> str:
        """Prefix of the policy's history entries (trailing slash included)."""
        return f"{self.history}policy/"

    def agent(self, host: str) -> str:
        """Key of the host agent's leased liveness/inventory record."""
        return f"{self.host(host)}agent"

    def host_workers(self, host: str) -> str:
        """Prefix of what the agent reports it runs (trailing slash included)."""
        return f"{self.host(host)}workers/"

    def workers(self, host: str, job: str) -> str:
        """Key of what the agent actually runs for ``job``."""
        return f"{self.host_workers(host)}{validate_name(job, 'job')}"

    @property
    def counts(self) -> str:
        """Prefix of every host's GPU counts, written by its agent (trailing slash included).

        Outside ``hosts/``: ``status --summary`` reads them all in one small
        range instead of every host's records.
        """
        return f"{self.root}/counts/"

    def host_counts(self, host: str) -> str:
        """Key of ``host``'s GPU counts (leased: they go with its agent)."""
        return f"{self.counts}{validate_name(host, 'host')}"

    @property
    def holders(self) -> str:
        """Prefix of the per-holder quota counters (trailing slash included)."""
        return f"{self.root}/holders/"

    def holder_count(self, kind: str, name: str) -> str:
        """Key counting what ``kind`` (user, team, unix) ``name`` holds, for its quotas."""
        return f"{self.holders}{validate_name(kind, 'holder kind')}/{validate_name(name, kind)}"

    @property
    def queue(self) -> str:
        """Prefix of every host's wait queue (trailing slash included)."""
        return f"{self.root}/queue/hosts/"

    def host_queue(self, host: str) -> str:
        """Prefix of the requests waiting for GPUs of ``host`` (trailing slash included)."""
        return f"{self.queue}{validate_name(host, 'host')}/"

    def queue_entry(self, host: str, entry: str) -> str:
        """Key of one waiting request (leased: a dead waiter's entry goes with its lease)."""
        return f"{self.host_queue(host)}{validate_name(entry, 'queue entry')}"

    def queue_cancel(self, entry_key: str) -> str:
        """Key that tells the waiter of ``entry_key`` who cancelled it (leased: it goes soon).

        Written with the entry's deletion, so a waiter that finds its entry
        gone can tell a cancel (it stops) from a lapsed lease (it joins again).
        """
        if not entry_key.startswith(self.queue):
            raise ValueError(f"{entry_key!r} is not a queue entry's key")
        return f"{self.root}/queue/cancelled/{entry_key[len(self.queue) :]}"

    def queue_arrivals(self, host: str) -> str:
        """Key bumped by every request that joins ``host``'s queue.

        A waiter's take compares it: a request that arrived meanwhile (maybe
        of a higher priority, so ahead of it) makes the take decide again.
        """
        return f"{self.root}/queue/arrivals/{validate_name(host, 'host')}"

    @property
    def submissions(self) -> str:
        """Prefix of every user's submitted batch jobs (trailing slash included)."""
        return f"{self.root}/submit/"

    def user_submissions(self, user: str) -> str:
        """Prefix of ``user``'s submissions: on etcd, only that user's role may write it."""
        return f"{self.submissions}{validate_name(user, 'user')}/"

    def submission(self, user: str, job: str) -> str:
        """Key of one submitted job's record (its queue entry points here)."""
        return f"{self.user_submissions(user)}{validate_name(job, 'job')}"

    def parse_host_key(self, key: str) -> tuple[str, str, str] | None:
        """Split ``<hosts>/<host>/<kind>[/<name>]`` into (host, kind, name).

        ``name`` is ``""`` for single keys like ``agent``. Returns ``None``
        for keys outside the hosts prefix.
        """
        return split_host_key(key, self.hosts)


def split_host_key(key: str, hosts: str) -> tuple[str, str, str] | None:
    """:meth:`KeyLayout.parse_host_key` with the layout's ``hosts`` prefix given.

    For a loop over a fleet's 14,000 keys: the prefix is a property that
    builds its string on every use.
    """
    if not key.startswith(hosts):
        return None
    parts = key[len(hosts) :].split("/")
    if len(parts) == 2:
        return parts[0], parts[1], ""
    if len(parts) == 3:
        return parts[0], parts[1], parts[2]
    return None
