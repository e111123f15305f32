"""PyTorch helpers on CPU (torch must be installed: a missing torch fails here, loudly)."""

from __future__ import annotations

import gc
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


NO_CUDA = pytest.mark.skipif(
    torch.cuda.is_available(), reason="this machine's CUDA works: nothing fails"
)


@pytest.fixture
def gpu_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as a worker the agent gave physical GPU 3."""
    monkeypatch.setenv("ALLOCATOR_DEVICE", "cuda")
    monkeypatch.setenv("ALLOCATOR_GPUS", "3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-00000000-0000-4000-8000-000000000003")
    monkeypatch.delenv("ALLOCATOR_FALLBACK_REASON", raising=False)


@NO_CUDA
def test_a_worker_assigned_a_gpu_never_falls_back_to_cpu_silently(gpu_worker: None) -> None:
    # torch here is the CPU build: exactly what a worker with the wrong wheel meets.
    with pytest.raises(atorch.GpuUnavailableError) as caught:
        atorch.device()
    message = str(caught.value)
    assert "assigned GPU 3" in message
    assert "GPU-00000000-0000-4000-8000-000000000003" in message
    assert "CPU-only build" in message and torch.__version__ in message
    assert "gpus=cpu" in message  # what to do instead


@NO_CUDA
@pytest.mark.parametrize(
    "helper", [atorch.configure, atorch.autocast_dtype, atorch.grad_scaler, atorch.autocast]
)
def test_every_helper_of_a_gpu_worker_without_cuda_fails_loudly(
    gpu_worker: None, helper: object
) -> None:
    with pytest.raises(atorch.GpuUnavailableError, match="GPU 3"):
        helper()  # type: ignore[operator]


@NO_CUDA
def test_visible_devices_set_by_another_scheduler_count_as_an_assignment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("ALLOCATOR_DEVICE", "ALLOCATOR_GPUS", "ALLOCATOR_FALLBACK_REASON"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with pytest.raises(atorch.GpuUnavailableError, match="CUDA_VISIBLE_DEVICES='1'"):
        atorch.device()


def test_a_script_given_nothing_runs_where_it_can(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ALLOCATOR_DEVICE", "ALLOCATOR_GPUS", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
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


@pytest.mark.slow
def test_a_tiny_model_trains_one_step_on_cpu_without_warnings(cpu_worker: None) -> None:
    torch.manual_seed(0)
    gc.collect()  # earlier tests' garbage must not warn inside the block
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
    assert [f"{w.category.__name__}: {w.message}" for w in caught] == []
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
    assert "pip install 'gpu-allocator[torch]'" in out.stdout


@NO_CUDA
def test_configure_hands_a_shared_gpus_memory_share_to_torch(
    gpu_worker: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A CUDA-less torch goes this far: past set_device, into the real
    # set_per_process_memory_fraction, which then finds no CUDA (a GPU host goes on).
    monkeypatch.setenv("ALLOCATOR_GPU_MEMORY_FRACTION", "0.25")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    with pytest.raises(AssertionError, match="not compiled with CUDA") as info:
        atorch.configure()
    called = [entry.name for entry in info.traceback]
    assert "set_per_process_memory_fraction" in called
    monkeypatch.delenv("ALLOCATOR_GPU_MEMORY_FRACTION")
    assert atorch.configure() == torch.device("cuda", 0)  # no share: nothing asked of CUDA


@pytest.mark.parametrize("bad", ["0", "1.5", "half", "nan", "-0.2"])
def test_a_memory_share_that_is_no_fraction_is_refused_before_cuda_is_touched(
    gpu_worker: None, monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    from allocator.errors import InvalidInput

    monkeypatch.setenv("ALLOCATOR_GPU_MEMORY_FRACTION", bad)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    with pytest.raises(InvalidInput, match="ALLOCATOR_GPU_MEMORY_FRACTION"):
        atorch.configure()
