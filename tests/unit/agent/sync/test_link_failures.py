"""What the store link does with each kind of failure (pure)."""

from __future__ import annotations

import pytest

from allocator.agent.sync.link_failures import judge
from allocator.errors import (
    ConflictError,
    LeaseLost,
    PermissionDenied,
    StoreError,
    StoreUnavailable,
)


def test_a_lost_lease_and_a_refused_request_keep_the_link() -> None:
    assert judge(LeaseLost("gone"), connected=True, has_store=True).action == "lease"
    refused = judge(ConflictError("held\n  by x"), connected=True, has_store=True)
    assert (refused.action, refused.event) == ("refused", "request-refused")
    assert refused.fields["error"] == "ConflictError: held by x"  # one line
    # Before the first read a refusal is no proof the store works: the link drops.
    assert judge(ConflictError("held"), connected=False, has_store=True).action == "drop"


@pytest.mark.parametrize(
    ("error", "event", "slowly"),
    [
        (StoreUnavailable("etcd at a:1: connection refused"), "store-unavailable", False),
        (PermissionDenied("etcdserver: permission denied"), "store-permission-denied", True),
        (StoreError("bad endpoint"), "store-error", False),
        (KeyError("bug"), "link-error", False),
    ],
)
def test_every_other_failure_drops_the_link_and_says_how_it_reconnects(
    error: Exception, event: str, slowly: bool
) -> None:
    verdict = judge(error, connected=True, has_store=True)
    assert (verdict.action, verdict.event, verdict.slowly) == ("drop", event, slowly)
    assert ("traceback" in verdict.fields) == (event == "link-error")
