"""Contract: leases expire, refresh and revoke, deleting their keys, on every backend.

TTLs are 2 s: etcd will not honour much shorter ones. Expiry is awaited by
polling with a deadline, never by a fixed sleep.
"""

from __future__ import annotations

import time

import pytest

from allocator.errors import InvalidInput, LeaseLost
from allocator.store import Put, Store
from tests.contract.test_watch import collect, summary

TTL_S = 2
EXPIRY_DEADLINE_S = 30.0  # real Consul: up to twice its 10 s minimum


def wait_until_gone(store: Store, key: str, deadline_s: float) -> bool:
    """Poll ``key`` until it disappears; return whether it did before the deadline."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if store.get(key) is None:
            return True
        time.sleep(0.1)
    return store.get(key) is None


def test_leased_key_records_its_lease(store: Store, prefix: str) -> None:
    lease = store.grant_lease(30)
    try:
        store.put(f"{prefix}/k", b"v", lease=lease)
        got = store.get(f"{prefix}/k")
        assert got is not None and got.lease == lease
    finally:
        store.revoke_lease(lease)


def test_expiry_deletes_the_leased_keys_and_a_watch_sees_it(store: Store, prefix: str) -> None:
    key, survivor = f"{prefix}/leased", f"{prefix}/plain"
    lease = store.grant_lease(TTL_S)
    try:
        store.put(survivor, b"no lease")
        written = store.put(key, b"alive", lease=lease)
        watch = store.watch(f"{prefix}/", written + 1)
        try:
            assert wait_until_gone(store, key, EXPIRY_DEADLINE_S)
            events = collect(watch, 1)
        finally:
            watch.close()
        assert summary(events)[0][:3] == ("delete", key, None)
        assert events[0].revision > written
        assert store.get(survivor) is not None
        with pytest.raises(LeaseLost):
            store.refresh_lease(lease)
    finally:
        store.revoke_lease(lease)


def test_refresh_keeps_a_lease_alive_past_its_ttl(store: Store, prefix: str) -> None:
    """A refreshed lease outlives a twin granted just after it and left alone.

    Backends round a TTL up (etcd to whole seconds, Consul to at least 10 s,
    and Consul may wait up to twice the TTL), so the test does not guess how
    long to wait: it refreshes one lease until the other has really expired.
    """
    key, control = f"{prefix}/heartbeat", f"{prefix}/control"
    lease = store.grant_lease(TTL_S)
    unrefreshed = store.grant_lease(TTL_S)
    try:
        store.put(key, b"alive", lease=lease)
        store.put(control, b"left alone", lease=unrefreshed)
        deadline = time.monotonic() + EXPIRY_DEADLINE_S
        while store.get(control) is not None:
            assert time.monotonic() < deadline, "a lease that was never refreshed did not expire"
            store.refresh_lease(lease)
            time.sleep(0.25)  # a heartbeat period, far inside the TTL
        got = store.get(key)
        assert got is not None and got.value == b"alive"
    finally:
        store.revoke_lease(lease)
        store.revoke_lease(unrefreshed)


def test_revoke_deletes_the_keys_at_once_with_events(store: Store, prefix: str) -> None:
    keys = [f"{prefix}/a", f"{prefix}/b"]
    lease = store.grant_lease(60)
    written = store.txn([], [Put(k, b"v", lease=lease) for k in keys])
    watch = store.watch(f"{prefix}/", written + 1)
    try:
        store.revoke_lease(lease)

        assert [store.get(k) for k in keys] == [None, None]
        events = collect(watch, 2)
        assert sorted((e.type, e.key) for e in events) == [("delete", k) for k in keys]
        assert events[0].revision == events[1].revision > written
    finally:
        watch.close()


def test_revoking_twice_is_not_an_error(store: Store) -> None:
    lease = store.grant_lease(60)
    store.revoke_lease(lease)
    store.revoke_lease(lease)
    with pytest.raises(LeaseLost):
        store.refresh_lease(lease)


def test_refresh_of_a_revoked_lease_raises_lease_lost(store: Store, prefix: str) -> None:
    lease = store.grant_lease(60)
    store.put(f"{prefix}/k", b"v", lease=lease)
    store.revoke_lease(lease)

    with pytest.raises(LeaseLost):
        store.refresh_lease(lease)


def test_put_with_a_revoked_lease_raises_lease_lost_and_writes_nothing(
    store: Store, prefix: str
) -> None:
    lease = store.grant_lease(60)
    store.revoke_lease(lease)

    with pytest.raises(LeaseLost):
        store.put(f"{prefix}/k", b"v", lease=lease)

    assert store.get(f"{prefix}/k") is None


@pytest.mark.parametrize("ttl", [0, -1])
def test_a_ttl_that_is_not_positive_is_rejected(store: Store, ttl: float) -> None:
    with pytest.raises(InvalidInput):
        store.grant_lease(ttl)
