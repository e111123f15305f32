"""A call on etcd rides out an election: every member saying "no leader" is asked again."""

from __future__ import annotations

import itertools
import time

import pytest

from allocator.errors import AmbiguousWrite, StoreUnavailable
from allocator.store.etcd.calls import ELECTION_PAUSE_S, EndpointCalls
from allocator.store.etcd.config import parse_etcd_url
from allocator.store.etcd.connection import Endpoint
from allocator.store.etcd.rules import Code, EtcdStatus
from tests.support.etcd_server import EtcdServer, free_port


@pytest.fixture
def store_url(etcd_server: EtcdServer) -> str:
    return etcd_server.url


def _calls(store_url: str, timeout: float = 5.0) -> EndpointCalls:
    return EndpointCalls(parse_etcd_url(f"{store_url}?timeout={timeout:g}"), None)


def _electing_for(answers: int, details: str) -> tuple[list[float], object]:
    tries: list[float] = []

    def send(_endpoint: Endpoint, _until: float) -> str:
        tries.append(time.monotonic())
        if len(tries) <= answers:
            raise EtcdStatus(Code.UNAVAILABLE, details)
        return "answered"

    return tries, send


@pytest.mark.parametrize("details", ["etcdserver: leader changed", "etcdserver: no leader"])
def test_a_read_during_an_election_is_asked_again_until_a_leader_answers(
    store_url: str, details: str
) -> None:
    calls = _calls(store_url)
    tries, send = _electing_for(3, details)
    try:
        assert calls.run(send, idempotent=True) == "answered"  # type: ignore[arg-type]
    finally:
        calls.close_connection()
    assert len(tries) == 4
    assert all(b - a >= ELECTION_PAUSE_S * 0.9 for a, b in itertools.pairwise(tries))


def test_an_election_longer_than_the_budget_is_store_unavailable(store_url: str) -> None:
    calls = _calls(store_url, timeout=1.0)
    tries, send = _electing_for(10_000, "etcdserver: no leader")
    started = time.monotonic()
    try:
        with pytest.raises(StoreUnavailable, match="no leader") as raised:
            calls.run(send, idempotent=True)  # type: ignore[arg-type]
    finally:
        calls.close_connection()
    assert not isinstance(raised.value, AmbiguousWrite)
    assert time.monotonic() - started < 1.5  # within the call's budget
    assert len(tries) > 2


def test_a_write_whose_answer_was_leader_changed_is_never_sent_again(store_url: str) -> None:
    """It may have been applied: the caller is told so (exit 4), never a second send."""
    calls = _calls(store_url)
    tries, send = _electing_for(1, "etcdserver: leader changed")
    try:
        with pytest.raises(AmbiguousWrite):
            calls.run(send, idempotent=False)  # type: ignore[arg-type]
    finally:
        calls.close_connection()
    assert len(tries) == 1


@pytest.mark.parametrize("idempotent", [True, False])
def test_an_election_is_ridden_out_when_the_killed_leader_is_the_last_endpoint_tried(
    store_url: str, idempotent: bool
) -> None:
    """A member says "no leader", the dead one refuses the connection: neither took it."""
    dead = f"127.0.0.1:{free_port()}"
    calls = _calls(f"{store_url},{dead}")
    tries, send = _electing_for(2, "etcdserver: no leader")
    try:
        assert calls.run(send, idempotent=idempotent) == "answered"  # type: ignore[arg-type]
    finally:
        calls.close_connection()
    assert len(tries) == 3
