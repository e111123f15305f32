"""What one policy apply costs an agent, at 12,500 hosts next to 1,000 (the scale group's fleets).

* policy bytes delivered per agent per one-host apply elsewhere: the
  events that reach exactly the keys a real agent watches
  (:func:`allocator.agent.sync.watches.agent_watch_keys`) while another
  host's entry changes; at most 4 KB. The baseline is the whole policy
  record, which every agent was sent on every apply before shares.
* bytes written to the store per one-host apply: every key and value the
  apply puts (and every key it deletes) under the fleet's prefix, seen by
  a watch on it; at most 50 KB. The baseline is the compiled policy, which
  every apply rewrote whole before its parts were named by their content.
* agent CPU per policy apply: the agent's policy-taking path (its read,
  the values fetched and decoded, its host's policy put together), 12,500
  hosts against 1,000; within 2x.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from allocator.agent.sync.host_records import host_view
from allocator.agent.sync.policy_read import PolicyReader, SharedPolicy
from allocator.agent.sync.watches import agent_watch_keys
from allocator.policy.shares import assemble
from allocator.records.keys import KeyLayout
from allocator.store import Store, Watch, open_store
from bench.common import Row, allocator_cli, interleaved, ratio_row, value_row
from bench.common import timed_run as run_timed
from bench.fleet import host_name

__all__ = ["BytesSeen", "bytes_seen", "rows", "written_row"]

#: How long the watches are drained after the apply returned (its events are already sent).
_DRAIN_SECONDS = 1.0


def rows(
    url: str,
    sizes: tuple[int, int],
    env: dict[str, str],
    files: tuple[Path, Path],
    rounds: int,
) -> list[Row]:
    """The rows; ``env`` and ``files`` (a one-host change, then back) are the large fleet's."""
    small, large = sizes
    seen = bytes_seen(url, f"/s{large}", host_name(large // 2), env, files)
    runs: dict[str, Callable[[], float]] = {
        str(size): _agent_take(url, f"/s{size}", host_name(size // 2)) for size in sizes
    }
    samples = interleaved(runs, max(10, rounds * 5))
    return [
        value_row(
            f"policy bytes delivered per agent per one-host apply elsewhere, {large:,} hosts",
            seen.delivered,
            4096,
            "bytes",
            note=f"the whole policy record, which every agent was sent before: {seen.whole} bytes",
        ),
        written_row(large, seen),
        ratio_row(
            f"agent CPU per policy apply, {large:,} vs {small:,} hosts",
            samples[str(large)],
            samples[str(small)],
            most=2.0,
        ),
    ]


@dataclass(frozen=True, slots=True)
class BytesSeen:
    """The most bytes one of two one-host applies sent one agent, and wrote to the store."""

    delivered: int
    written: int
    whole: int  # the policy record's size
    compiled: int  # the compiled policy's: its record's and its parts'


def written_row(hosts: int, seen: BytesSeen) -> Row:
    """Bytes written to the store per one-host apply (see the module doc)."""
    return value_row(
        f"bytes written to the store per one-host policy apply, {hosts:,} hosts",
        seen.written,
        50_000,
        "bytes",
        note=f"the compiled policy, which every apply rewrote before: {seen.compiled} bytes",
    )


def bytes_seen(
    url: str, prefix: str, host: str, env: dict[str, str], files: tuple[Path, Path]
) -> BytesSeen:
    """What two applies of another host's entry sent ``host``'s watches and wrote (the most)."""
    layout = KeyLayout(prefix)
    store = open_store(url)
    try:
        most, written = 0, 0
        for path in files:
            revision = store.list(layout.shares, limit=1).revision
            watches = [store.watch(key, revision + 1) for key in agent_watch_keys(layout, host)]
            everything = store.watch(f"{layout.root}/", revision + 1)
            try:
                run_timed(allocator_cli("policy", "apply", str(path)), env)
                most = max(most, _drained(watches))
                written = max(written, _drained([everything]))
            finally:
                for watch in [*watches, everything]:
                    watch.close()
        item = store.get(layout.policy)
        compiled = sum(len(i.value) for i in store.list(f"{layout.root}/compiled/").items)
        return BytesSeen(most, written, len(item.value) if item else 0, compiled)
    finally:
        store.close()


def _drained(watches: list[Watch]) -> int:
    total = 0
    deadline = time.monotonic() + _DRAIN_SECONDS
    while time.monotonic() < deadline:
        for watch in watches:
            for event in watch.next(0.05):
                total += len(event.key) + len(event.value or b"")
    return total


def _agent_take(url: str, prefix: str, host: str) -> Callable[[], float]:
    """One policy take by a fresh reader (every value fetched and decoded); its CPU seconds."""
    store: Store = open_store(url)
    layout = KeyLayout(prefix)

    def take() -> float:
        started = time.process_time()
        listing, read = PolicyReader(layout, host).read(store)
        shared = host_view(listing, None, layout, host, read=read).policy
        assert isinstance(shared, SharedPolicy), "the fleet's shares were not read"
        assemble(shared.common_policy, shared.part, host)
        return time.process_time() - started

    return take
