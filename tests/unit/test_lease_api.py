"""``allocator.lease()`` refuses a process whose CUDA is already initialised."""

from __future__ import annotations

import sys
import types

import pytest

import allocator
from allocator.errors import RequestError


def test_lease_refuses_when_torch_already_initialised_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = types.SimpleNamespace(is_initialized=lambda: True)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    held = allocator.lease(count=1, store="memory://never-opened")
    with pytest.raises(RequestError, match="CUDA is already initialised"):
        held.__enter__()


def test_lease_checks_cuda_only_through_an_already_imported_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from allocator.leasing import cuda_initialised

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert cuda_initialised() is False and "torch" not in sys.modules


def test_lease_wait_takes_the_clis_durations_and_none_for_forever() -> None:
    from allocator.leasing import wait_seconds

    assert wait_seconds("30m") == 1800.0
    assert wait_seconds("1h30m") == 5400.0
    assert wait_seconds(90) == 90.0 and wait_seconds(2.5) == 2.5
    assert wait_seconds(None) == float("inf")
    assert wait_seconds("forever") == float("inf")
    assert wait_seconds(0) == 0.0


@pytest.mark.parametrize("bad", ["soon", "30", -1, True, float("nan"), [1]])
def test_a_bad_lease_wait_is_one_clear_value_error(bad: object) -> None:
    held = allocator.lease(count=1, wait=bad, store="memory://never-opened")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^lease\(wait=") as raised:
        held.__enter__()
    assert "\n" not in str(raised.value)
