"""The Consul backend against the Consul test double: wire behaviour and failure modes.

What every backend must do is in tests/contract; this file checks what is
particular to Consul: tokens travel as headers, errors are translated, the
watch survives an index going backwards and is rate-limited, sessions expire.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import pytest

from allocator.errors import (
    EXIT_PERMISSION,
    CasConflict,
    Compacted,
    LeaseLost,
    PermissionDenied,
    StoreUnavailable,
)
from allocator.store import MAX_VALUE_BYTES, Delete, Event, Put, Store, Watch, open_store
from allocator.store.consul.config import parse_consul_url
from allocator.store.consul.store import ConsulStore, open_consul
from tests.support.consul_double import ConsulDouble

DEADLINE_S = 20.0


@pytest.fixture
def double() -> Iterator[ConsulDouble]:
    with ConsulDouble() as running:
        yield running


def store_for(double: ConsulDouble, **options: float) -> ConsulStore:
    """A store on ``double``, blind to this machine's CONSUL_* variables."""
    return ConsulStore(double.url, parse_consul_url(double.url, {}), **options)


@pytest.fixture
def store(double: ConsulDouble) -> Iterator[ConsulStore]:
    s = store_for(double)
    try:
        yield s
    finally:
        s.close()


def collect(watch: Watch, count: int) -> list[Event]:
    events: list[Event] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(events) < count and time.monotonic() < deadline:
        events.extend(watch.next(1.0))
    return events


def kv_paths(double: ConsulDouble) -> list[str]:
    return [r.path for r in double.requests if r.path.startswith("/v1/kv/")]


# --- mapping and requests ------------------------------------------------------------


def test_open_store_picks_the_consul_backend(double: ConsulDouble, prefix: str) -> None:
    s: Store = open_store(double.url)
    try:
        revision = s.put(f"{prefix}/k", b"v")
        got = s.get(f"{prefix}/k")
    finally:
        s.close()
    assert isinstance(s, ConsulStore) and isinstance(s, Store)
    assert got is not None and got.mod_revision == revision


def test_keys_are_stored_without_their_leading_slash(
    store: ConsulStore, double: ConsulDouble, prefix: str
) -> None:
    store.put(f"{prefix}/a/b", b"v")
    store.get(f"{prefix}/a/b")

    assert f"/v1/kv{prefix}/a/b?consistent=1" in kv_paths(double)
    assert not any("//" in path for path in kv_paths(double))


def test_list_is_one_recursive_consistent_read(
    store: ConsulStore, double: ConsulDouble, prefix: str
) -> None:
    for name in ("a", "b", "c"):
        store.put(f"{prefix}/{name}", b"v")
    before = len(double.requests)

    listing = store.list(f"{prefix}/")

    recursive = [p for p in kv_paths(double)[-2:] if "recurse" in p]
    assert len(listing.items) == 3
    assert len(recursive) == 1 and "consistent" in recursive[0]
    assert len(double.requests) - before == 2  # the listing and the store-index probe


def test_writes_go_through_txn_and_return_the_exact_index(
    store: ConsulStore, double: ConsulDouble, prefix: str
) -> None:
    revision = store.put(f"{prefix}/k", b"v")

    assert double.requests[-1].path == "/v1/txn"
    assert revision == double.index


def test_a_delete_only_txn_reports_the_index_of_its_delete(
    store: ConsulStore, double: ConsulDouble, prefix: str
) -> None:
    store.put(f"{prefix}/a", b"1")
    store.put(f"{prefix}/b", b"2")

    revision = store.txn([], [Delete(f"{prefix}/a"), Delete(f"{prefix}/b")])

    assert revision == double.index
    assert store.list(f"{prefix}/").revision == revision


def test_an_oversized_value_is_refused_before_anything_is_sent(
    store: ConsulStore, double: ConsulDouble, prefix: str
) -> None:
    before = len(double.requests)

    with pytest.raises(Exception, match=str(MAX_VALUE_BYTES)):
        store.put(f"{prefix}/big", b"x" * (MAX_VALUE_BYTES + 1))

    assert len(double.requests) == before


def test_a_value_too_big_for_a_txn_body_goes_through_the_kv_endpoint(
    store: ConsulStore, double: ConsulDouble, prefix: str
) -> None:
    value = b"y" * MAX_VALUE_BYTES

    revision = store.put(f"{prefix}/big", value, expect_revision=0)

    assert any(r.method == "PUT" and "?cas=0" in r.path for r in double.requests)
    got = store.get(f"{prefix}/big")
    assert got is not None and got.value == value and got.mod_revision == revision
    with pytest.raises(CasConflict):
        store.put(f"{prefix}/big", value, expect_revision=0)


# --- tokens and permissions --------------------------------------------------------


def test_the_token_travels_only_as_a_header(monkeypatch: pytest.MonkeyPatch, prefix: str) -> None:
    token = "t0ken-7f3a"
    monkeypatch.setenv("CONSUL_HTTP_TOKEN", token)
    with ConsulDouble(acl_tokens={token: ""}) as double:
        s = open_consul(double.url)
        try:
            s.put(f"{prefix}/k", b"v")
            s.get(f"{prefix}/k")
            s.list(f"{prefix}/")
            s.txn([], [Put(f"{prefix}/t", b"v")])
            s.delete(f"{prefix}/k")
            lease = s.grant_lease(30)
            s.refresh_lease(lease)
            s.revoke_lease(lease)
            watch = s.watch(f"{prefix}/", 0)
            watch.next(0.05)
        finally:
            s.close()
        requests = double.requests

    assert len(requests) >= 10
    assert all(r.headers.get("X-Consul-Token") == token for r in requests)
    assert not any(token in r.path for r in requests)
    assert not any(token in json.dumps(parse_qs(urlsplit(r.path).query)) for r in requests)


def test_an_unknown_token_is_permission_denied(
    monkeypatch: pytest.MonkeyPatch, prefix: str
) -> None:
    monkeypatch.setenv("CONSUL_HTTP_TOKEN", "wrong")
    with ConsulDouble(acl_tokens={"right": ""}) as double:
        s = open_consul(double.url)
        try:
            for attempt in (
                lambda: s.get(f"{prefix}/k"),
                lambda: s.put(f"{prefix}/k", b"v"),
                lambda: s.list(f"{prefix}/"),
                lambda: s.grant_lease(10),
            ):
                with pytest.raises(PermissionDenied) as caught:
                    attempt()
                assert caught.value.exit_code == EXIT_PERMISSION
                assert double.address in str(caught.value)
        finally:
            s.close()


def test_a_write_outside_the_tokens_prefix_is_permission_denied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONSUL_HTTP_TOKEN", "ops")
    with ConsulDouble(acl_tokens={"ops": "allocator/"}) as double:
        s = open_consul(double.url)
        try:
            assert s.put("/allocator/v1/policy", b"ok")
            with pytest.raises(PermissionDenied):
                s.put("/elsewhere/k", b"v")
            with pytest.raises(PermissionDenied):
                s.txn([], [Put("/allocator/v1/a", b"v"), Put("/elsewhere/b", b"v")])
            assert s.get("/allocator/v1/a") is None
        finally:
            s.close()


# --- unreachable servers ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_closed_port_is_store_unavailable_naming_the_address(prefix: str) -> None:
    url = f"consul://127.0.0.1:{free_port()}"
    s = open_consul(url)
    try:
        with pytest.raises(StoreUnavailable) as caught:
            s.get(f"{prefix}/k")
    finally:
        s.close()
    assert url.replace("consul://", "http://") in str(caught.value)


def test_a_server_that_never_answers_is_store_unavailable_not_a_hang(prefix: str) -> None:
    with socket.socket() as silent:  # accepts connections (backlog) but never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"consul://127.0.0.1:{silent.getsockname()[1]}"
        s = ConsulStore(url, parse_consul_url(url, {}), connect_timeout=0.5, request_timeout=0.5)
        try:
            with pytest.raises(StoreUnavailable, match="no answer in time"):
                s.put(f"{prefix}/k", b"v")
        finally:
            s.close()


def test_a_watch_raises_store_unavailable_when_the_server_goes_away(prefix: str) -> None:
    double = ConsulDouble()
    double.start()
    s = store_for(double)
    try:
        watch = s.watch(f"{prefix}/", 0)
        double.stop()
        with pytest.raises(StoreUnavailable):
            watch.next(5.0)
    finally:
        s.close()
        double.stop()


def test_a_closed_store_refuses_calls(store: ConsulStore, prefix: str) -> None:
    store.close()
    store.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        store.get(f"{prefix}/k")


# --- watches -------------------------------------------------------------------------------


def test_watch_sees_puts_and_deletes_in_order(store: ConsulStore, prefix: str) -> None:
    watch = store.watch(f"{prefix}/", store.put(f"{prefix}/before", b"x") + 1)
    try:
        first = store.put(f"{prefix}/a", b"1")
        assert collect(watch, 1) == [Event("put", f"{prefix}/a", b"1", first)]
        second = store.put(f"{prefix}/a", b"2")
        assert collect(watch, 1) == [Event("put", f"{prefix}/a", b"2", second)]
        store.delete(f"{prefix}/a")
        gone = store.list(f"{prefix}/").revision
        assert collect(watch, 1) == [Event("delete", f"{prefix}/a", None, gone)]
    finally:
        watch.close()


def test_watch_recovers_when_the_index_goes_backwards(
    store: ConsulStore, double: ConsulDouble, prefix: str
) -> None:
    store.put(f"{prefix}/a", b"1")
    snapshot = double.snapshot()
    store.put(f"{prefix}/b", b"2")
    latest = store.put(f"{prefix}/c", b"3")
    watch = store.watch(f"{prefix}/", latest + 1)
    try:
        double.restore(snapshot)  # the raft index goes back below `latest`
        restored = collect(watch, 2)
        new = store.put(f"{prefix}/d", b"4")
        after = collect(watch, 1)
    finally:
        watch.close()

    assert sorted((e.type, e.key) for e in restored) == [
        ("delete", f"{prefix}/b"),
        ("delete", f"{prefix}/c"),
    ]
    assert new < latest  # the new write's revision is lower than what the watch saw before
    assert after == [Event("put", f"{prefix}/d", b"4", new)]


def test_a_watch_is_rate_limited_when_the_server_answers_at_once(
    double: ConsulDouble, prefix: str
) -> None:
    s = store_for(double, watch_min_interval=0.25)
    try:
        watch = s.watch(f"{prefix}/", 0)
        double.early_return = True  # every blocking query comes back at once, unchanged
        before = len(double.requests)

        assert watch.next(1.0) == []

        # A burst of 2, then one query per 0.25 s: a handful, not a busy loop's hundreds.
        assert len(double.requests) - before <= 8
    finally:
        s.close()


def test_a_quiet_watch_sends_one_blocking_query_per_next(
    store: ConsulStore, double: ConsulDouble, prefix: str
) -> None:
    watch = store.watch(f"{prefix}/", 0)
    before = len(double.requests)

    for _ in range(3):
        assert watch.next(0.2) == []

    queries = double.requests[before:]
    assert len(queries) == 3
    assert all("index=" in r.path and "wait=" in r.path for r in queries)
    watch.close()


def test_a_watch_from_before_a_delete_raises_compacted(store: ConsulStore, prefix: str) -> None:
    store.put(f"{prefix}/a", b"1")
    store.put(f"{prefix}/b", b"2")
    store.delete(f"{prefix}/b")
    deleted_at = store.list(f"{prefix}/").revision

    watch = store.watch(f"{prefix}/", deleted_at)
    with pytest.raises(Compacted):
        watch.next(1.0)
    watch.close()

    resumed = store.watch(f"{prefix}/", store.list(f"{prefix}/").revision + 1)
    try:
        assert resumed.next(0.1) == []
    finally:
        resumed.close()


# --- leases -------------------------------------------------------------------------------


def session_list(double: ConsulDouble) -> list[dict[str, object]]:
    with urllib.request.urlopen(f"http://{double.address}/v1/session/list") as answer:
        sessions: list[dict[str, object]] = json.load(answer)
    return sessions


def test_a_lease_is_a_delete_session_with_consuls_minimum_ttl(
    store: ConsulStore, double: ConsulDouble
) -> None:
    lease = store.grant_lease(2)

    [session] = session_list(double)

    assert session["Behavior"] == "delete"
    assert session["TTL"] == "10s"  # 2 s is below Consul's 10 s minimum
    store.revoke_lease(lease)
    assert session_list(double) == []


def test_session_expiry_deletes_leased_keys_and_a_watch_sees_it(prefix: str) -> None:
    with ConsulDouble(ttl_scale=0.1) as double:  # the 10 s minimum TTL lasts 1 s
        s = store_for(double)
        try:
            lease = s.grant_lease(1)
            written = s.put(f"{prefix}/agent", b"alive", lease=lease)
            watch = s.watch(f"{prefix}/", written + 1)

            events = collect(watch, 1)

            assert [(e.type, e.key) for e in events] == [("delete", f"{prefix}/agent")]
            assert s.get(f"{prefix}/agent") is None
            with pytest.raises(LeaseLost):
                s.refresh_lease(lease)
        finally:
            s.close()


def test_a_put_with_a_lease_takes_a_key_over_from_another_lease(
    store: ConsulStore, prefix: str
) -> None:
    key = f"{prefix}/agent"
    old, new = store.grant_lease(60), store.grant_lease(60)
    store.put(key, b"old agent", lease=old)

    store.put(key, b"new agent", lease=new)
    store.revoke_lease(old)

    got = store.get(key)
    assert got is not None and (got.value, got.lease) == (b"new agent", new)
    store.revoke_lease(new)
    assert store.get(key) is None


def test_concurrent_stores_share_one_double(double: ConsulDouble, prefix: str) -> None:
    stores = [store_for(double) for _ in range(4)]
    errors: list[BaseException] = []

    def write(index: int) -> None:
        try:
            for n in range(5):
                stores[index].put(f"{prefix}/{index}/{n}", b"v")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_S)
    for s in stores:
        s.close()

    assert errors == []
    check = store_for(double)
    try:
        assert len(check.list(f"{prefix}/").items) == 20
    finally:
        check.close()


def test_a_refused_write_names_the_operation_the_key_and_what_to_grant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONSUL_HTTP_TOKEN", "ops")
    with ConsulDouble(acl_tokens={"ops": "allocator/"}) as double:
        s, address = open_consul(double.url), double.address
        try:
            with pytest.raises(PermissionDenied) as caught:
                s.txn([], [Put("/allocator/v1/a", b"v"), Delete("/elsewhere/b")])
        finally:
            s.close()
    text = str(caught.value)
    assert f"Consul at http://{address} refused txn delete /elsewhere/b" in text, text
    assert 'grant the token\'s ACL policy key "elsewhere/b" { policy = "write" }' in text, text
    assert "\n" not in text
