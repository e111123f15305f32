"""Idle releases, carried out by the store link (the loop only decides them).

The releases of finished jobs (``release_on_exit``) take the same path: one
list holds both, offered together, each judged at its assignment's revision.

A release the loop asked for is done with ``Allocator.release``'s semantics
(one transaction comparing the host's generation and the job index) and
only if the assignment is still the one judged idle: it compares the
assignment key's revision too, so an operator who set the job again in the
meantime wins and nothing of theirs is removed. The reason goes with it
(``idle for 2h03m (policy idle rule on pool a100)``), for the history.

The loop offers the same release on every sample while the job stays idle;
each (job, revision) is tried until it is done or overtaken, never twice.
A refused permission is logged and not retried for that revision: the
agent's credential may legitimately be read-mostly, and the link must not
treat it as an outage. Any other refusal (the store or the control layer
saying no to the request) is the same: logged, not retried, never an outage.

A job across hosts is changed and released only as a whole, so its idle
share is released with ``Allocator.release_across``: the whole job, in one
transaction that also compares this host's share's revision. Whichever
host's agent judges its share idle first does it; a second agent doing the
same at the same moment finds the job gone (or loses the compare and then
finds it gone), which is an ordinary "overtaken".
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from allocator.agent.planning.types import IdleRelease
from allocator.errors import (
    AllocatorError,
    BadRecord,
    ConflictError,
    NotFound,
    Retryable,
)
from allocator.records.codec import decode_record
from allocator.records.keys import KeyLayout
from allocator.records.types import Assignment
from allocator.store import Store

__all__ = ["IdleReleaser"]

Log = Callable[[str, dict[str, Any]], None]


class IdleReleaser:
    """Pending idle releases of one host; thread-safe between the loop and the link."""

    def __init__(self, layout: KeyLayout, host: str, log: Log) -> None:
        self.layout = layout
        self.host = host
        self.log = log
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, int], IdleRelease] = {}
        self._finished: set[tuple[str, int]] = set()

    def offer(self, releases: Sequence[IdleRelease]) -> bool:
        """Queue what is not queued or finished yet; return whether anything new came.

        ``releases`` is everything due now: a finished release no longer
        offered is forgotten.
        """
        with self._lock:
            self._finished &= {(r.job, r.revision) for r in releases}
            new = [
                r
                for r in releases
                if (r.job, r.revision) not in self._pending
                and (r.job, r.revision) not in self._finished
            ]
            for release in new:
                self._pending[(release.job, release.revision)] = release
        return bool(new)

    def run(self, store: Store) -> None:
        """Carry out every pending release (store errors propagate: the link retries)."""
        with self._lock:
            pending = list(self._pending.values())
        for release in pending:
            outcome, detail = self._release(store, release)
            fields = {"job": release.job, "reason": release.reason}
            self.log(
                f"{release.kind}-{outcome}", {**fields, "detail": detail} if detail else fields
            )
            with self._lock:
                self._pending.pop((release.job, release.revision), None)
                if outcome != "release-conflict":  # a conflict may clear: offered again later
                    self._finished.add((release.job, release.revision))

    def _release(self, store: Store, release: IdleRelease) -> tuple[str, str]:
        from allocator.control.client import Allocator

        key = self.layout.assignment(self.host, release.job)
        item = store.get(key)
        if item is None or item.mod_revision != release.revision:
            return "release-overtaken", "the assignment changed since it was judged idle"
        allocator = Allocator(
            store, prefix=self.layout.prefix, actor=f"agent@{self.host}", acts_for_policy=True
        )
        try:
            if _across_hosts(item.value, key, release.job, self.host):
                allocator.release_across(
                    release.job, reason=release.reason, if_share=(self.host, release.revision)
                )
            else:
                allocator.release(
                    self.host, release.job, reason=release.reason, if_revision=release.revision
                )
        except NotFound:
            return "release-overtaken", "the job no longer holds GPUs here"
        except ConflictError as exc:
            return "release-conflict", str(exc)
        except Retryable:
            raise  # the store is away: the link's outage handling, and the release stays pending
        except AllocatorError as exc:  # a refusal (permission, policy, request): not an outage
            return "release-refused", f"{type(exc).__name__}: {exc}"
        return "released", ""


def _across_hosts(value: bytes, key: str, job: str, host: str) -> bool:
    """Whether the stored share belongs to a job across hosts (a damaged one: no)."""
    try:
        share = decode_record(value, Assignment, key, job=job, host=host)
    except BadRecord:
        return False
    return len(share.nodes) > 1
