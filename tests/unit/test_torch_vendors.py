"""The torch helpers per vendor: cuda (NVIDIA, ROCm), xpu, mps, cpu.

torch here is the CPU build; each test stubs the device check at the torch
boundary (``torch.cuda.is_available``, ``torch.xpu.is_available``,
``torch.backends.mps.is_available``) and sets the environment the agent gives
a worker of that vendor.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

import allocator.torch as atorch

WORKER_VARIABLES = (
    "ALLOCATOR_DEVICE",
    "ALLOCATOR_VENDOR",
    "ALLOCATOR_GPUS",
    "ALLOCATOR_THREADS",
    "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK",
    "ALLOCATOR_GPU_MEMORY_FRACTION",
)


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No worker variables from outside; torch's thread count and oneDNN restored after."""
    for name in WORKER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    threads, onednn = torch.get_num_threads(), torch.backends.mkldnn.enabled
    yield
    torch.set_num_threads(threads)
    setattr(torch.backends.mkldnn, "enabled", onednn)  # noqa: B010


def given(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def devices_work(
    monkeypatch: pytest.MonkeyPatch, *, cuda: bool = False, xpu: bool = False, mps: bool = False
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.xpu, "is_available", lambda: xpu)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)


INTEL = {"ALLOCATOR_DEVICE": "xpu", "ALLOCATOR_VENDOR": "intel", "ALLOCATOR_GPUS": "2,0"}
AMD = {
    "ALLOCATOR_DEVICE": "cuda",
    "ALLOCATOR_VENDOR": "amd",
    "ALLOCATOR_GPUS": "1",
    "ROCR_VISIBLE_DEVICES": "GPU-7A3E0C1D00000001",
}
APPLE = {"ALLOCATOR_DEVICE": "mps", "ALLOCATOR_VENDOR": "apple", "ALLOCATOR_GPUS": "0"}


def test_intel_worker_runs_on_xpu(monkeypatch: pytest.MonkeyPatch) -> None:
    given(monkeypatch, ZE_AFFINITY_MASK="2,0", **INTEL)
    devices_work(monkeypatch, cuda=True, xpu=True, mps=True)  # xpu wins: it was assigned
    chosen: list[torch.device] = []
    monkeypatch.setattr(torch.xpu, "set_device", chosen.append)
    assert atorch.configure() == torch.device("xpu", 0)
    assert chosen == [torch.device("xpu", 0)]
    assert atorch.autocast_dtype() == torch.bfloat16
    assert not atorch.grad_scaler().is_enabled()  # bfloat16 needs no loss scaling
    assert atorch.grad_scaler(torch.float16).is_enabled()


def test_intel_worker_without_xpu_never_falls_back_to_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    given(monkeypatch, ZE_AFFINITY_MASK="2,0", **INTEL)
    devices_work(monkeypatch, cuda=True)
    with pytest.raises(atorch.GpuUnavailableError) as caught:
        atorch.device()
    message = str(caught.value)
    assert "Intel GPU 2,0" in message and "ZE_AFFINITY_MASK='2,0'" in message
    assert "without XPU support" in message and "gpus=cpu" in message


def test_amd_worker_runs_on_rocm_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    given(monkeypatch, **AMD)
    devices_work(monkeypatch, cuda=True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    assert atorch.configure() == torch.device("cuda", 0)
    assert atorch.autocast_dtype() == torch.float16


def test_amd_worker_with_a_cuda_wheel_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    given(monkeypatch, **AMD)
    devices_work(monkeypatch)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.version, "hip", None)
    with pytest.raises(atorch.GpuUnavailableError) as caught:
        atorch.device()
    message = str(caught.value)
    assert "AMD GPU 1" in message and "GPU-7A3E0C1D" in message
    assert "a CUDA build (CUDA 12.4), not a ROCm build" in message


def test_apple_worker_runs_on_mps(monkeypatch: pytest.MonkeyPatch) -> None:
    given(monkeypatch, **APPLE)
    devices_work(monkeypatch, cuda=True, mps=True)
    assert atorch.configure() == torch.device("mps")
    assert atorch.autocast_dtype() == torch.float16


def test_apple_worker_without_mps_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    given(monkeypatch, **APPLE)
    devices_work(monkeypatch)
    with pytest.raises(atorch.GpuUnavailableError, match=r"torch\.mps cannot use it"):
        atorch.autocast()


@pytest.mark.parametrize(
    ("works", "expected"),
    [
        ({"cuda": True, "xpu": True}, torch.device("cuda", 0)),
        ({"xpu": True, "mps": True}, torch.device("xpu", 0)),
        ({"mps": True}, torch.device("mps")),
        ({}, torch.device("cpu")),
    ],
)
def test_a_script_given_nothing_takes_the_first_device_that_works(
    monkeypatch: pytest.MonkeyPatch, works: dict[str, bool], expected: torch.device
) -> None:
    devices_work(monkeypatch, **works)
    assert atorch.device() == expected


def test_cpu_fallback_turns_onednn_on_and_sets_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    given(monkeypatch, ALLOCATOR_DEVICE="cpu", ALLOCATOR_VENDOR="amd", ROCR_VISIBLE_DEVICES="-1")
    devices_work(monkeypatch, cuda=True, xpu=True, mps=True)  # never used on a CPU fallback
    setattr(torch.backends.mkldnn, "enabled", False)  # noqa: B010
    torch.set_num_threads(1)
    assert atorch.configure() == torch.device("cpu")
    assert torch.backends.mkldnn.enabled
    assert torch.get_num_threads() == len(os.sched_getaffinity(0))  # no rule: its CPUs
    monkeypatch.setenv("ALLOCATOR_THREADS", "2")
    atorch.configure()
    assert torch.get_num_threads() == 2
    assert atorch.autocast_dtype() == torch.bfloat16 and not atorch.grad_scaler().is_enabled()


@pytest.mark.parametrize(
    ("env", "opened"),
    # MPS's error is a dispatcher dump, of which only the tail comes back.
    [(INTEL, "Torch not compiled with XPU enabled"), (APPLE, "AutogradMPS")],
)
def test_the_health_check_opens_the_workers_own_device_type(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], opened: str
) -> None:
    given(monkeypatch, **env)
    result = atorch.health_check(timeout=120.0)
    # This CPU build has neither runtime: the probe fails, on that device type's own error.
    assert not result.ok and not result.timed_out
    assert opened in result.output and "not compiled with CUDA" not in result.output


def test_mixed_precision_on_mps_too_old_for_it_is_refused_up_front(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    given(monkeypatch, **APPLE)
    devices_work(monkeypatch, mps=True)
    monkeypatch.setattr(torch, "__version__", "2.7.1")
    with pytest.raises(RuntimeError, match=r"GradScaler.step\(\) on mps .*PyTorch 2.8 or newer"):
        atorch.grad_scaler()
    assert not atorch.grad_scaler(torch.bfloat16).is_enabled()  # no scaling, nothing to refuse
    monkeypatch.setattr(torch, "__version__", "2.4.1")
    with pytest.raises(RuntimeError, match=r"autocast on mps .*PyTorch 2.5 or newer"):
        atorch.autocast()
