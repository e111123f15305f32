"""The real store link paces its idle requests by the fleet's size in the policy.

The link's own timers are driven with a fake clock (no thread, no sleeps):
what it asks of the store over an hour of idling is counted by request
kind, for a small fleet and a large one.
"""

from __future__ import annotations

import queue
from collections import Counter
from typing import Any

from allocator.agent.config import AgentConfig
from allocator.agent.sync.store_thread import StoreLink
from allocator.control.client import Allocator
from allocator.store import Store
from allocator.store.memory import MemoryStore
from tests.support.clock import FakeClock

HOST = "n0001"
HOUR = 3600.0
COUNTED = ("refresh_lease", "grant_lease", "read_many")


class Counting:
    """A store that counts the calls the link makes of :data:`COUNTED`."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._store, name)
        if name not in COUNTED:
            return found

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return found(*args, **kwargs)

        return counted


def _idle_hour(hosts: int, prefix: str) -> Counter[str]:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    policy = f'version: 1\nhosts:\n  "n[0001-{hosts:04d}]": {{gpus: 8}}\n'
    Allocator(store, prefix=prefix).apply_policy(policy, "fleet.yaml")
    counting = Counting(store)
    config = AgentConfig(host=HOST, prefix=prefix)
    link = StoreLink(
        config,
        "memory://x",
        lambda *_: None,
        queue.Queue(),
        open_store=lambda _: counting,  # type: ignore[arg-type]
        clock=clock,
    )
    try:
        link._tick(clock())  # connect, the first read: the fleet's size is learnt
        counting.calls.clear()
        end = clock() + HOUR
        while clock() < end:
            clock.advance(max(link._sleep_for(clock()), 0.001))
            link._tick(clock())
    finally:
        link._stop_watches()
    return counting.calls


def test_a_small_fleets_agent_idles_at_its_own_settings(prefix: str) -> None:
    calls = _idle_hour(40, prefix)
    assert 355 <= calls["refresh_lease"] <= 361  # every 10 s
    assert 119 <= calls["read_many"] <= 121  # every 30 s
    assert calls["grant_lease"] == 0


def test_a_large_fleets_agent_keeps_its_lease_alive_and_reads_less_often(prefix: str) -> None:
    calls = _idle_hour(4_000, prefix)  # 4,000 hosts: a 20 s heartbeat, a 200 s resync
    assert calls["grant_lease"] == 1  # once: the longer lease, when the size was learnt
    assert 178 <= calls["refresh_lease"] + calls["grant_lease"] <= 181
    assert 17 <= calls["read_many"] <= 19
