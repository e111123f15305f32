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
