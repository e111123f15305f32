"""What an etcd refusal says: the operation, the key, the user and what to grant."""

from __future__ import annotations

from allocator.errors import PermissionDenied
from allocator.store import Compare, Delete, Put, Read
from allocator.store.etcd.refusals import is_refusal, named, probes

REFUSED = PermissionDenied("etcd at h1:2379: etcdserver: permission denied")


def test_a_refusal_names_the_key_and_what_to_grant() -> None:
    text = str(named(REFUSED, "range", "/a/v1/hosts/", "alice", prefix=True))
    assert text == (
        "etcd at h1:2379 refused range /a/v1/hosts/ (prefix) (user alice): "
        "grant a role of alice read on /a/v1/hosts/ --prefix=true"
    )


def test_only_a_refused_key_is_renamed_not_a_refused_login() -> None:
    assert is_refusal(REFUSED)
    assert not is_refusal(PermissionDenied("etcd at h: etcdserver: authentication failed"))


def test_each_key_of_a_transaction_is_probed_with_nothing_applied() -> None:
    found = list(
        probes([Compare("/c", 3)], [Put("/p", b"v"), Delete("/d/", prefix=True)], [Read("/r")])
    )
    assert [(verb, key, prefix) for verb, key, prefix, _ in found] == [
        ("compare", "/c", False),
        ("put", "/p", False),
        ("delete", "/d/", True),
        ("range", "/r", False),
    ]
    # Nothing in a success branch, and no compare: etcd checks the op and never runs it.
    assert all(probe["success"] == [] and "compare" not in probe for *_, probe in found)
