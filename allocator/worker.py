"""What a worker process reads from its environment. Imports no torch.

The agent starts each worker with the variables of
:func:`allocator.placement.worker_env.worker_environments`; this module reads them
back: job, host, device (``cuda``/``cpu``), physical GPUs, the visible
device list as CUDA will parse it, torchrun-style ranks, the CPU-fallback
reason and thread count, and the share of a shared GPU's memory.

``CUDA_VISIBLE_DEVICES`` is parsed the way the CUDA driver does (as
documented in the CUDA programming guide, and as PyTorch's
``torch.cuda._parse_visible_devices`` models it):

* unset: every device; set but empty: none (so ``""``, ``-1`` and
  ``NoDevFiles``, which start with no valid entry, all mean none);
* entries are split on ``,`` and parsing stops at the first invalid entry:
  ``0,2,-1,1`` is devices 0 and 2;
* the first entry decides the form. Index entries are read like C's
  ``strtoul``: leading whitespace is skipped and anything after the digits
  is ignored (``" 1"``, ``"1 "`` and ``"1gpu"`` all read as 1; a negative
  or non-numeric entry is invalid). ``GPU-``/``MIG-`` entries (UUIDs, their
  unique prefixes, ``MIG-GPU-<uuid>/<gi>/<ci>``) are compared verbatim: a
  space before ``GPU-`` makes the entry invalid, and so does an entry of
  the other form;
* a repeated entry makes the whole list invalid: CUDA then enumerates no
  device at all.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast

from allocator.errors import InvalidInput

__all__ = [
    "VisibleDevices",
    "WorkerAssignment",
    "current",
    "device_kind",
    "fallback_reason",
    "gpu_assigned",
    "local_rank",
    "memory_fraction",
    "parse_visible_devices",
    "rank",
    "threads",
    "vendor",
    "world_size",
]

VisibleKind = Literal["all", "none", "index", "uuid", "mig"]
DeviceKind = Literal["cuda", "xpu", "mps", "cpu"]


@dataclass(frozen=True, slots=True)
class VisibleDevices:
    """The devices CUDA will enumerate, in order (``cuda:0`` is ``entries[0]``).

    ``kind="all"``: the variable is unset, every device is visible and
    ``entries`` is empty. ``note`` says why parsing stopped early or gave none.
    """

    kind: VisibleKind
    entries: tuple[str, ...] = ()
    raw: str | None = None
    note: str = ""

    @property
    def count(self) -> int | None:
        """How many devices are visible; ``None`` for all of them."""
        return None if self.kind == "all" else len(self.entries)

    @property
    def indices(self) -> tuple[int, ...]:
        """The entries as device indices (empty unless ``kind == "index"``)."""
        return tuple(int(e) for e in self.entries) if self.kind == "index" else ()


def _strtoul(text: str) -> int:
    """C strtoul on one entry: skip leading space, read digits, ignore the rest; -1 if none."""
    body = text.lstrip()
    sign = body[:1] if body[:1] in "+-" else ""
    digits = ""
    for char in body[len(sign) :]:
        if char not in "0123456789":  # ASCII only, as C's isdigit
            break
        digits += char
    if not digits:
        return -1
    value = int(digits)
    return -value if sign == "-" and value else value


def parse_visible_devices(value: str | None) -> VisibleDevices:
    """Parse ``CUDA_VISIBLE_DEVICES`` as CUDA does (see the module docstring)."""
    if value is None:
        return VisibleDevices("all", note="unset: every device is visible")
    prefix = "GPU-" if value.startswith("GPU-") else "MIG-" if value.startswith("MIG-") else ""
    kind: VisibleKind = "uuid" if prefix == "GPU-" else "mig" if prefix else "index"
    entries: list[str] = []
    note = ""
    for position, item in enumerate(value.split(",")):
        entry = _entry(item, prefix)
        if entry is None:
            note = f"stopped at invalid entry {position} ({item!r})" if value else "empty"
            break
        if entry in entries:
            return VisibleDevices("none", (), value, f"duplicate entry {item!r}: no device")
        entries.append(entry)
    if not entries:
        return VisibleDevices("none", (), value, note or "no valid entry")
    return VisibleDevices(kind, tuple(entries), value, note)


def _entry(item: str, prefix: str) -> str | None:
    """The normalised entry, or ``None`` if CUDA stops parsing at it."""
    if prefix:
        return item if item.startswith(prefix) else None
    number = _strtoul(item)
    return str(number) if number >= 0 else None


@dataclass(frozen=True, slots=True)
class WorkerAssignment:
    """Everything a worker was told through its environment.

    ``gpus`` (``ALLOCATOR_GPUS``) are the physical GPUs in the order the
    device type numbers them: ``gpus[i]`` is ``cuda:i`` or ``xpu:i`` (on Intel
    the agent lists them in PCI order, as Level Zero's mask does not reorder).
    ``visible`` is ``CUDA_VISIBLE_DEVICES`` as CUDA parses it (NVIDIA only).
    """

    job: str | None
    host: str | None
    device: DeviceKind
    gpus: tuple[int, ...]
    visible: VisibleDevices
    local_rank: int
    rank: int
    world_size: int
    local_world_size: int
    fallback_reason: str | None
    threads: int | None


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def _int_var(env: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise InvalidInput(f"{name}={raw!r} is not an integer >= {minimum}")
    return value


def local_rank(environ: Mapping[str, str] | None = None) -> int:
    """This worker's rank on its host (``LOCAL_RANK``, default 0)."""
    return _int_var(_env(environ), "LOCAL_RANK", 0, 0)


def rank(environ: Mapping[str, str] | None = None) -> int:
    """This worker's global rank (``RANK``, default its local rank)."""
    env = _env(environ)
    return _int_var(env, "RANK", local_rank(env), 0)


def world_size(environ: Mapping[str, str] | None = None) -> int:
    """How many workers the job has (``WORLD_SIZE``, default 1)."""
    return _int_var(_env(environ), "WORLD_SIZE", 1, 1)


def fallback_reason(environ: Mapping[str, str] | None = None) -> str | None:
    """Why the worker runs on CPU (``ALLOCATOR_FALLBACK_REASON``), if it does."""
    return _env(environ).get("ALLOCATOR_FALLBACK_REASON") or None


def threads(environ: Mapping[str, str] | None = None) -> int | None:
    """CPU threads to use: ``ALLOCATOR_THREADS``, else ``OMP_NUM_THREADS``; ``None`` if unset."""
    env = _env(environ)
    for name in ("ALLOCATOR_THREADS", "OMP_NUM_THREADS"):
        if env.get(name, "").strip():
            return _int_var(env, name, 0, 1)
    return None


def memory_fraction(environ: Mapping[str, str] | None = None) -> float | None:
    """This worker's share of its GPU's memory on a shared GPU (``ALLOCATOR_GPU_MEMORY_FRACTION``).

    ``None`` when unset (the GPU is the worker's alone, or its share is not
    known); :class:`InvalidInput` for anything but a number in (0, 1].
    """
    raw = _env(environ).get("ALLOCATOR_GPU_MEMORY_FRACTION", "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:  # also refuses nan
        raise InvalidInput(f"ALLOCATOR_GPU_MEMORY_FRACTION={raw!r} is not a number in (0, 1]")
    return value


def device_kind(environ: Mapping[str, str] | None = None) -> DeviceKind:
    """The PyTorch device type of this worker's assignment: ``ALLOCATOR_DEVICE``.

    ``cuda`` (NVIDIA, and AMD under ROCm), ``xpu`` (Intel), ``mps`` (Apple) or
    ``cpu``; ``cpu`` also whenever ``CUDA_VISIBLE_DEVICES`` leaves no CUDA
    device visible (a variable that says nothing about xpu or mps).
    """
    env = _env(environ)
    declared = env.get("ALLOCATOR_DEVICE", "").strip()
    if declared not in ("", "cuda", "xpu", "mps", "cpu"):
        raise InvalidInput(f"ALLOCATOR_DEVICE={declared!r}: expected cuda, xpu, mps or cpu")
    if declared in ("xpu", "mps", "cpu"):
        return cast(DeviceKind, declared)
    if parse_visible_devices(env.get("CUDA_VISIBLE_DEVICES")).kind == "none":
        return "cpu"
    return "cuda"


def vendor(environ: Mapping[str, str] | None = None) -> str:
    """Whose GPUs this worker was given (``ALLOCATOR_VENDOR``; "" when the agent did not say)."""
    return _env(environ).get("ALLOCATOR_VENDOR", "").strip()


def gpu_assigned(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process was given GPUs: it must then never quietly run on CPU.

    ``ALLOCATOR_DEVICE`` naming a GPU type (the agent's word) or, without it, a
    ``CUDA_VISIBLE_DEVICES`` naming devices (set by hand, or by another
    scheduler). Nothing set at all is no assignment: a script run by hand.
    """
    env = _env(environ)
    if device_kind(env) == "cpu":
        return False
    if env.get("ALLOCATOR_DEVICE", "").strip() in ("cuda", "xpu", "mps"):
        return True
    return parse_visible_devices(env.get("CUDA_VISIBLE_DEVICES")).kind not in ("all", "none")


def _gpus(env: Mapping[str, str]) -> tuple[int, ...]:
    raw = env.get("ALLOCATOR_GPUS", "").strip()
    if not raw:
        return ()
    try:
        gpus = tuple(int(part) for part in raw.split(","))
    except ValueError:
        gpus = (-1,)
    if any(gpu < 0 for gpu in gpus):
        raise InvalidInput(f"ALLOCATOR_GPUS={raw!r} is not a list of GPU indices")
    return gpus


def current(environ: Mapping[str, str] | None = None) -> WorkerAssignment:
    """Read this worker's assignment from ``environ`` (default ``os.environ``)."""
    env = _env(environ)
    local = local_rank(env)
    return WorkerAssignment(
        job=env.get("ALLOCATOR_JOB") or None,
        host=env.get("ALLOCATOR_HOST") or None,
        device=device_kind(env),
        gpus=_gpus(env),
        visible=parse_visible_devices(env.get("CUDA_VISIBLE_DEVICES")),
        local_rank=local,
        rank=_int_var(env, "RANK", local, 0),
        world_size=world_size(env),
        local_world_size=_int_var(env, "LOCAL_WORLD_SIZE", world_size(env), 1),
        fallback_reason=fallback_reason(env),
        threads=threads(env),
    )
