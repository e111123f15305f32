"""This machine's names: the host ``run`` and ``lease()`` take GPUs on, and who acts."""

from __future__ import annotations

import os

import pytest

from allocator.errors import InvalidInput
from allocator.util.identity import check_this_host, clean_name, local_hostname, this_host

FULL = os.uname().nodename


def test_this_machine_is_its_host_name_short_or_full(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ALLOCATOR_HOST", raising=False)
    assert this_host() == local_hostname() == FULL.split(".")[0]
    check_this_host(FULL)
    check_this_host(FULL.split(".")[0])


def test_allocator_host_names_this_machine_as_the_policy_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ALLOCATOR_HOST", "node1")
    assert this_host() == "node1"
    check_this_host("node1")
    check_this_host(FULL)  # still its own name too


def test_another_host_is_one_line_invalid_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALLOCATOR_HOST", "node1")
    with pytest.raises(InvalidInput) as refused:
        check_this_host("node2")
    said = str(refused.value)
    assert said.startswith("host=node2 is not this machine (this is node1; set ALLOCATOR_HOST")
    assert "\n" not in said and refused.value.exit_code == 2


def test_an_empty_allocator_host_is_no_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALLOCATOR_HOST", "")
    assert this_host() == local_hostname()
    with pytest.raises(InvalidInput):
        check_this_host("")


def test_names_for_audit_fields_are_printable_and_bounded() -> None:
    assert clean_name("a\x1b[2Jb" + "x" * 100) == ("a\\x1b[2Jb" + "x" * 100)[:64]
