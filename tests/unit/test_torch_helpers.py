"""PyTorch helpers on CPU (torch must be installed: a missing torch fails here, loudly)."""

from __future__ import annotations

import inspect
import subprocess
import sys
import warnings
from collections.abc import Iterator

import pytest
import torch

import allocator.torch as atorch

CPU_FALLBACK = {
    "CUDA_VISIBLE_DEVICES": "",
    "NVIDIA_VISIBLE_DEVICES": "void",
    "ALLOCATOR_DEVICE": "cpu",
    "ALLOCATOR_FALLBACK_REASON": "no GPU free",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "ALLOCATOR_THREADS": "1",
}


@pytest.fixture
def cpu_worker(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process as a CPU-fallback worker; torch's thread count restored after."""
    for name, value in CPU_FALLBACK.items():
        monkeypatch.setenv(name, value)
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def test_device_is_cpu_on_fallback(cpu_worker: None) -> None:
    assert atorch.device() == torch.device("cpu")


def test_device_is_cpu_when_cuda_is_not_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALLOCATOR_DEVICE", "cuda")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    expected = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    assert atorch.device() == expected


def test_configure_sets_threads_and_leaves_onednn_on(
    cpu_worker: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ALLOCATOR_THREADS", "2")
    torch.set_num_threads(1)
    assert atorch.configure() == torch.device("cpu")
    assert torch.get_num_threads() == 2
    assert torch.backends.mkldnn.enabled


def test_autocast_is_bfloat16_on_cpu(cpu_worker: None) -> None:
    assert atorch.autocast_dtype() == torch.bfloat16
    assert atorch.autocast_dtype(torch.float16) == torch.float16
    layer = torch.nn.Linear(4, 2)
    with atorch.autocast():
        out = layer(torch.randn(3, 4))
    assert out.dtype == torch.bfloat16


def test_grad_scaler_is_disabled_on_cpu(cpu_worker: None) -> None:
    scaler = atorch.grad_scaler()
    assert isinstance(scaler, torch.amp.GradScaler)
    assert not scaler.is_enabled()
    assert not atorch.grad_scaler(torch.float16).is_enabled()


def test_a_tiny_model_trains_one_step_on_cpu_without_warnings(cpu_worker: None) -> None:
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dev = atorch.configure()
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        model.to(dev)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = atorch.grad_scaler()
        x = torch.randn(64, 8, device=dev)
        y = x.sum(dim=1, keepdim=True)

        def loss_now() -> torch.Tensor:
            with atorch.autocast():
                return torch.nn.functional.mse_loss(model(x).float(), y)

        before = loss_now()
        scaler.scale(before).backward()  # type: ignore[no-untyped-call]
        grads = [p.grad for p in model.parameters()]
        assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        with torch.no_grad():
            after = loss_now()
    assert caught == []
    assert after.item() < before.item()


def test_rank_readers_are_the_worker_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert (atorch.local_rank(), atorch.world_size()) == (1, 2)


def test_health_check_fails_without_a_visible_gpu(cpu_worker: None) -> None:
    result = atorch.health_check(timeout=120.0)
    assert not result.ok and not result.timed_out
    assert result.returncode not in (0, None)


def test_no_deprecated_cuda_amp_api() -> None:
    source = inspect.getsource(atorch)
    assert "cuda.amp" not in source
    assert "torch.amp.autocast" in source and "torch.amp.GradScaler" in source


def test_missing_torch_names_the_extra_to_install() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "try:\n"
        "    import allocator.torch\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert "pip install 'allocator[torch]'" in out.stdout
