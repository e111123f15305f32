"""The Consul test double follows Consul's documented HTTP semantics.

These tests speak raw HTTP (no py-consul), so they check the wire format the
backend relies on: status codes, X-Consul-Index, base64 values, txn errors.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.consul_double import ConsulDouble, parse_duration
from tests.support.waiting import wait_for

DEADLINE_S = 20.0


class Reply:
    """One HTTP answer: status, headers, decoded body."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.raw = body

    @property
    def index(self) -> int:
        return int(self.headers["X-Consul-Index"])

    def json(self) -> Any:
        return json.loads(self.raw)


def call(
    double: ConsulDouble,
    method: str,
    path: str,
    body: bytes | str | None = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    """Send one request to the double and return its answer."""
    host, port = double.address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=DEADLINE_S)
    try:
        data = body.encode() if isinstance(body, str) else body
        conn.request(method, path, body=data, headers=headers or {})
        answer = conn.getresponse()
        return Reply(answer.status, dict(answer.getheaders()), answer.read())
    finally:
        conn.close()


def txn(double: ConsulDouble, *ops: dict[str, Any], token: str | None = None) -> Reply:
    headers = {"X-Consul-Token": token} if token else {}
    return call(double, "PUT", "/v1/txn", json.dumps([{"KV": op} for op in ops]), headers)


def wait_for_blocking_query(double: ConsulDouble) -> None:
    """Until the double has received a blocking query; a failure if it never does."""
    wait_for(
        "the blocking query to reach the double",
        lambda: any("index=" in r.path for r in double.requests),
        timeout=DEADLINE_S,
    )


def b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


@pytest.fixture
def double() -> Iterator[ConsulDouble]:
    with ConsulDouble() as running:
        yield running


def test_put_then_get_returns_the_documented_entry(double: ConsulDouble) -> None:
    assert call(double, "PUT", "/v1/kv/app/k", b"v1").json() is True

    reply = call(double, "GET", "/v1/kv/app/k")

    assert reply.status == 200
    [entry] = reply.json()
    assert entry["Key"] == "app/k"
    assert base64.b64decode(entry["Value"]) == b"v1"
    assert entry["CreateIndex"] == entry["ModifyIndex"] == reply.index
    assert entry["LockIndex"] == 0 and entry["Flags"] == 0 and "Session" not in entry


def test_empty_value_is_null_and_raw_returns_the_bytes(double: ConsulDouble) -> None:
    call(double, "PUT", "/v1/kv/app/empty", b"")
    call(double, "PUT", "/v1/kv/app/bin", bytes(range(256)))

    assert call(double, "GET", "/v1/kv/app/empty").json()[0]["Value"] is None
    assert call(double, "GET", "/v1/kv/app/bin?raw").raw == bytes(range(256))


def test_missing_key_is_404_with_an_index(double: ConsulDouble) -> None:
    call(double, "PUT", "/v1/kv/app/other", b"x")

    reply = call(double, "GET", "/v1/kv/app/missing")

    assert reply.status == 404
    assert reply.index >= 1


def test_keys_with_a_leading_slash_are_rejected(double: ConsulDouble) -> None:
    assert call(double, "PUT", "/v1/kv//app/k", b"v").status == 400


def test_cas_zero_creates_only_and_cas_n_compares_modify_index(double: ConsulDouble) -> None:
    assert call(double, "PUT", "/v1/kv/app/k?cas=0", b"a").json() is True
    assert call(double, "PUT", "/v1/kv/app/k?cas=0", b"b").json() is False
    current = call(double, "GET", "/v1/kv/app/k").json()[0]["ModifyIndex"]

    assert call(double, "PUT", f"/v1/kv/app/k?cas={current + 100}", b"c").json() is False
    assert call(double, "PUT", f"/v1/kv/app/k?cas={current}", b"d").json() is True
    assert call(double, "GET", "/v1/kv/app/k?raw").raw == b"d"
    assert call(double, "PUT", "/v1/kv/app/missing?cas=5", b"e").json() is False


def test_an_unchanged_write_keeps_its_modify_index(double: ConsulDouble) -> None:
    call(double, "PUT", "/v1/kv/app/k", b"same")
    before = call(double, "GET", "/v1/kv/app/k").json()[0]["ModifyIndex"]

    call(double, "PUT", "/v1/kv/app/k", b"same")
    unchanged = call(double, "GET", "/v1/kv/app/k").json()[0]
    call(double, "PUT", "/v1/kv/app/k?flags=7", b"same")
    changed = call(double, "GET", "/v1/kv/app/k").json()[0]

    assert unchanged["ModifyIndex"] == before
    assert changed["ModifyIndex"] > before and changed["Flags"] == 7


def test_recurse_lists_a_plain_string_prefix_with_its_newest_index(double: ConsulDouble) -> None:
    for key in ("app/b", "app/a", "apple", "other"):
        call(double, "PUT", f"/v1/kv/{key}", key.encode())

    reply = call(double, "GET", "/v1/kv/app?recurse")

    assert [e["Key"] for e in reply.json()] == ["app/a", "app/b", "apple"]
    assert reply.index == max(e["ModifyIndex"] for e in reply.json())
    assert reply.index < double.index  # "other" was written later, elsewhere


def test_keys_listing_rolls_up_at_the_separator(double: ConsulDouble) -> None:
    for key in ("app/a", "app/dir/x", "app/dir/y"):
        call(double, "PUT", f"/v1/kv/{key}", b"v")

    reply = call(double, "GET", "/v1/kv/app/?keys&separator=/")

    assert reply.json() == ["app/a", "app/dir/"]


def test_a_deleted_key_still_raises_the_prefix_index(double: ConsulDouble) -> None:
    call(double, "PUT", "/v1/kv/app/a", b"1")
    call(double, "PUT", "/v1/kv/app/b", b"2")
    before = call(double, "GET", "/v1/kv/app/?recurse").index

    assert call(double, "DELETE", "/v1/kv/app/b").json() is True

    after = call(double, "GET", "/v1/kv/app/?recurse")
    assert [e["Key"] for e in after.json()] == ["app/a"]
    assert after.index > before  # the tombstone's index, not app/a's


def test_blocking_query_wakes_on_a_change(double: ConsulDouble) -> None:
    call(double, "PUT", "/v1/kv/app/k", b"old")
    index = call(double, "GET", "/v1/kv/app/?recurse").index
    answers: list[Reply] = []
    waiter = threading.Thread(
        target=lambda: answers.append(
            call(double, "GET", f"/v1/kv/app/?recurse&index={index}&wait=60s")
        )
    )
    waiter.start()

    call(double, "PUT", "/v1/kv/app/k", b"new")

    waiter.join(DEADLINE_S)  # far below the 60 s wait: only the change can end it
    assert not waiter.is_alive()
    assert answers[0].index > index
    assert base64.b64decode(answers[0].json()[0]["Value"]) == b"new"


def test_blocking_query_wakes_on_a_delete(double: ConsulDouble) -> None:
    call(double, "PUT", "/v1/kv/app/k", b"v")
    index = call(double, "GET", "/v1/kv/app/?recurse").index
    answers: list[Reply] = []
    waiter = threading.Thread(
        target=lambda: answers.append(
            call(double, "GET", f"/v1/kv/app/?recurse&index={index}&wait=60s")
        )
    )
    waiter.start()

    call(double, "DELETE", "/v1/kv/app/k")

    waiter.join(DEADLINE_S)
    assert not waiter.is_alive()
    assert answers[0].status == 404 and answers[0].index > index


def test_blocking_query_without_a_change_answers_after_wait_with_the_same_index(
    double: ConsulDouble,
) -> None:
    call(double, "PUT", "/v1/kv/app/k", b"v")
    index = call(double, "GET", "/v1/kv/app/?recurse").index

    call(double, "PUT", "/v1/kv/elsewhere", b"x")
    reply = call(double, "GET", f"/v1/kv/app/?recurse&index={index}&wait=50ms")

    assert reply.index == index


def test_early_return_answers_a_blocking_query_at_once_unchanged(double: ConsulDouble) -> None:
    call(double, "PUT", "/v1/kv/app/k", b"v")
    index = call(double, "GET", "/v1/kv/app/?recurse").index
    double.early_return = True

    reply = call(double, "GET", f"/v1/kv/app/?recurse&index={index}&wait=10m")

    assert reply.index == index


def test_restore_makes_the_index_go_backwards_and_wakes_queries(double: ConsulDouble) -> None:
    call(double, "PUT", "/v1/kv/app/a", b"1")
    snapshot = double.snapshot()
    call(double, "PUT", "/v1/kv/app/b", b"2")
    index = call(double, "GET", "/v1/kv/app/?recurse").index
    answers: list[Reply] = []
    waiter = threading.Thread(
        target=lambda: answers.append(
            call(double, "GET", f"/v1/kv/app/?recurse&index={index}&wait=60s")
        )
    )
    waiter.start()
    wait_for_blocking_query(double)

    double.restore(snapshot)

    waiter.join(DEADLINE_S)
    assert not waiter.is_alive()
    assert answers[0].index < index
    assert [e["Key"] for e in answers[0].json()] == ["app/a"]


def test_txn_applies_all_writes_at_one_index(double: ConsulDouble) -> None:
    call(double, "PUT", "/v1/kv/app/old", b"o")

    reply = txn(
        double,
        {"Verb": "set", "Key": "app/a", "Value": b64(b"1")},
        {"Verb": "set", "Key": "app/b", "Value": b64(b"2")},
        {"Verb": "delete", "Key": "app/old"},
        {"Verb": "check-not-exists", "Key": "app/new"},
    )

    assert reply.status == 200
    results = reply.json()["Results"]
    assert [r["KV"]["Key"] for r in results] == ["app/a", "app/b"]  # none for delete/check
    assert {r["KV"]["ModifyIndex"] for r in results} == {double.index}
    assert all(r["KV"]["Value"] is None for r in results)
    assert call(double, "GET", "/v1/kv/app/old").status == 404


def test_failed_txn_writes_nothing_and_lists_every_failed_op(double: ConsulDouble) -> None:
    call(double, "PUT", "/v1/kv/app/guard", b"g")
    guard = call(double, "GET", "/v1/kv/app/guard").json()[0]["ModifyIndex"]
    before = call(double, "GET", "/v1/kv/app/?recurse").index

    reply = txn(
        double,
        {"Verb": "set", "Key": "app/a", "Value": b64(b"1")},
        {"Verb": "check-index", "Key": "app/guard", "Index": guard + 1},
        {"Verb": "check-not-exists", "Key": "app/guard"},
        {"Verb": "delete", "Key": "app/guard"},
    )

    assert reply.status == 409
    assert reply.json()["Results"] is None
    assert [e["OpIndex"] for e in reply.json()["Errors"]] == [1, 2]
    assert call(double, "GET", "/v1/kv/app/a").status == 404
    assert call(double, "GET", "/v1/kv/app/?recurse").index == before


def test_read_only_txn_takes_no_index_and_get_returns_values(double: ConsulDouble) -> None:
    call(double, "PUT", "/v1/kv/app/k", b"v")
    index = double.index

    reply = txn(
        double,
        {"Verb": "get", "Key": "app/k"},
        {"Verb": "check-index", "Key": "app/k", "Index": index},
    )

    assert reply.status == 200
    assert base64.b64decode(reply.json()["Results"][0]["KV"]["Value"]) == b"v"
    assert double.index == index


def test_values_over_512_kib_get_413(double: ConsulDouble) -> None:
    limit = 512 * 1024
    assert call(double, "PUT", "/v1/kv/app/max", b"x" * limit).json() is True

    assert call(double, "PUT", "/v1/kv/app/big", b"x" * (limit + 1)).status == 413
    big_txn = txn(
        double,
        {"Verb": "set", "Key": "app/t", "Value": b64(b"x" * (limit // 2))},
        {"Verb": "set", "Key": "app/u", "Value": b64(b"x" * (limit // 2))},
    )
    assert big_txn.status == 413
    assert call(double, "GET", "/v1/kv/app/big").status == 404
    assert call(double, "GET", "/v1/kv/app/t").status == 404


def test_too_many_txn_ops_get_413(double: ConsulDouble) -> None:
    ops = [{"Verb": "set", "Key": f"app/{i}", "Value": ""} for i in range(65)]
    assert txn(double, *ops).status == 413


def create_session(double: ConsulDouble, **fields: Any) -> str:
    reply = call(double, "PUT", "/v1/session/create", json.dumps(fields))
    assert reply.status == 200, reply.raw
    return str(reply.json()["ID"])


def test_session_ttl_must_be_between_10s_and_24h(double: ConsulDouble) -> None:
    assert call(double, "PUT", "/v1/session/create", json.dumps({"TTL": "5s"})).status == 400
    assert call(double, "PUT", "/v1/session/create", json.dumps({"TTL": "25h"})).status == 400
    assert create_session(double, TTL="10s")


def test_lock_is_exclusive_and_counts_acquisitions(double: ConsulDouble) -> None:
    first, second = create_session(double), create_session(double)

    assert call(double, "PUT", f"/v1/kv/app/lock?acquire={first}", b"1").json() is True
    assert call(double, "PUT", f"/v1/kv/app/lock?acquire={second}", b"2").json() is False
    assert call(double, "PUT", f"/v1/kv/app/lock?release={first}", b"3").json() is True
    assert call(double, "PUT", f"/v1/kv/app/lock?acquire={second}", b"4").json() is True

    entry = call(double, "GET", "/v1/kv/app/lock").json()[0]
    assert entry["Session"] == second and entry["LockIndex"] == 2
    bad = txn(double, {"Verb": "lock", "Key": "app/x", "Value": "", "Session": "no-such"})
    assert bad.status == 409 and "invalid session" in bad.json()["Errors"][0]["What"]


def test_expired_delete_session_deletes_its_keys_and_renew_is_404() -> None:
    with ConsulDouble(ttl_scale=0.1) as double:  # the 10 s minimum TTL becomes 1 s
        sid = create_session(double, TTL="10s", Behavior="delete")
        call(double, "PUT", f"/v1/kv/app/leased?acquire={sid}", b"alive")
        call(double, "PUT", "/v1/kv/app/plain", b"stays")

        deadline = time.monotonic() + DEADLINE_S
        while call(double, "GET", "/v1/kv/app/leased").status != 404:
            assert time.monotonic() < deadline, "the session never expired"
            time.sleep(0.05)

        assert call(double, "PUT", f"/v1/session/renew/{sid}").status == 404
        assert call(double, "GET", "/v1/kv/app/plain").status == 200
        assert call(double, "GET", f"/v1/session/info/{sid}").json() == []


def test_renewing_keeps_a_session_and_destroy_releases_its_locks() -> None:
    with ConsulDouble(ttl_scale=0.1) as double:
        # A 3 s TTL renewed every 0.2 s: a loaded machine may stall a renewal by
        # seconds without the session expiring, while a renewal that does not
        # extend the TTL lets it expire within the 4.5 s the loop runs.
        sid = create_session(double, TTL="30s")  # behavior "release"
        call(double, "PUT", f"/v1/kv/app/lock?acquire={sid}", b"v")
        outlive = time.monotonic() + 4.5  # one and a half scaled TTLs
        while time.monotonic() < outlive:
            assert call(double, "PUT", f"/v1/session/renew/{sid}").status == 200
            time.sleep(0.2)  # the renewal period
        assert call(double, "GET", "/v1/kv/app/lock").json()[0]["Session"] == sid

        assert call(double, "PUT", f"/v1/session/destroy/{sid}").json() is True

        entry = call(double, "GET", "/v1/kv/app/lock").json()[0]
        assert "Session" not in entry and base64.b64decode(entry["Value"]) == b"v"
        assert call(double, "PUT", f"/v1/session/destroy/{sid}").json() is True  # idempotent


def test_acl_token_checks() -> None:
    with ConsulDouble(acl_tokens={"ops": "app/"}) as double:
        ops = {"X-Consul-Token": "ops"}
        assert call(double, "PUT", "/v1/kv/app/k", b"v", ops).json() is True
        assert (
            call(double, "PUT", "/v1/kv/app/k", b"v", {"Authorization": "Bearer ops"}).status == 200
        )

        wrong = call(double, "GET", "/v1/kv/app/k", headers={"X-Consul-Token": "nope"})
        anonymous = call(double, "GET", "/v1/kv/app/k")
        outside = call(double, "PUT", "/v1/kv/secret", b"v", ops)
        in_txn = txn(double, {"Verb": "set", "Key": "secret", "Value": ""}, token="ops")

        assert (wrong.status, wrong.raw) == (403, b"ACL not found")
        assert (anonymous.status, anonymous.raw) == (403, b"Permission denied")
        assert outside.status == 403
        assert in_txn.status == 409 and in_txn.json()["Errors"][0]["What"] == "Permission denied"
        assert call(double, "PUT", "/v1/session/create", "{}").status == 403


def test_listing_leaves_out_keys_the_token_may_not_read() -> None:
    with ConsulDouble(acl_tokens={"root": "", "ops": "app/"}) as double:
        for key in ("app/k", "apx/k"):
            call(double, "PUT", f"/v1/kv/{key}", b"v", {"X-Consul-Token": "root"})

        reply = call(double, "GET", "/v1/kv/ap?recurse", headers={"X-Consul-Token": "ops"})

        assert [e["Key"] for e in reply.json()] == ["app/k"]


def test_request_log_records_method_path_and_headers(double: ConsulDouble) -> None:
    call(double, "GET", "/v1/kv/app/k?recurse", headers={"X-Consul-Token": "t"})

    logged = double.requests[-1]

    assert (logged.method, logged.path) == ("GET", "/v1/kv/app/k?recurse")
    assert logged.headers["X-Consul-Token"] == "t"


def test_stop_cuts_a_blocking_query() -> None:
    double = ConsulDouble()
    double.start()
    call(double, "PUT", "/v1/kv/app/k", b"v")
    index = double.index

    def wait_forever() -> None:
        with contextlib.suppress(OSError):  # a cut connection is the expected end
            call(double, "GET", f"/v1/kv/app/?recurse&index={index}&wait=10m")

    waiter = threading.Thread(target=wait_forever)
    waiter.start()
    wait_for_blocking_query(double)

    double.stop()

    waiter.join(DEADLINE_S)
    assert not waiter.is_alive()


@pytest.mark.parametrize(
    ("text", "seconds"), [("10s", 10.0), ("1500ms", 1.5), ("1m30s", 90.0), ("2h", 7200.0)]
)
def test_parse_duration_reads_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "10", "s", "10x", "1s junk"])
def test_parse_duration_rejects_malformed_text(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)
