"""What a request asks for: which GPUs (or how many, or the CPU), and how much of each.

A :class:`Request` is checked for its shape when it is made; :func:`ask_of`
then says what it takes of each GPU under the policy: ``slots`` of it in a
shared pool, or all of it for a job the policy marks ``exclusive``.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from msgspec import Struct

from allocator.errors import RequestError
from allocator.policy.model import Policy, Sharing
from allocator.records.fields import MAX_SLOTS

if TYPE_CHECKING:
    from allocator.placement.ranking import Prefer

__all__ = ["Ask", "Request", "ask_of", "describe_request", "pool_sharing"]


class Request(Struct, frozen=True):
    """What an operator asks for: exactly one of explicit ``gpus``, a ``count``, or ``cpu``.

    ``slots`` is how many slots of each GPU of a shared pool the job takes
    (``None``: one); ``prefer="links"`` makes ``count=N`` in a shared pool
    weigh links before free capacity. ``asker``: the subjects of who asks
    (``user:``, ``team:``, ``unix:``), which reservations' ``who`` admit;
    ``self_service``: a ``run``/``lease()`` request, whose job name its asker
    picks, so reservations' job globs do not admit it. ``time``: the time limit asked for
    (``time=2h`` as typed; ``None``: the pool's default), which the planner
    resolves against the pool's maximum; ``preemptible``: its GPUs go back to a
    normal request that needs them. Construction validates the shape, so a
    malformed request never exists: :class:`RequestError` for an empty or
    duplicated GPU list, a negative index, ``count < 1``, slots out of range
    or on a CPU request, or not exactly one kind of request. A Struct (a
    dataclass costs every ``set`` half a millisecond to define): copies with
    changes are ``msgspec.structs.replace``, which validates again.
    """

    job: str
    host: str
    gpus: tuple[int, ...] | None = None
    count: int | None = None
    cpu: bool = False
    slots: int | None = None
    prefer: Prefer = "free"
    asker: tuple[str, ...] = ()
    self_service: bool = False
    time: str | None = None
    preemptible: bool = False

    def __post_init__(self) -> None:
        kinds = [k for k, v in (("gpus", self.gpus), ("count", self.count)) if v is not None]
        if self.cpu:
            kinds.append("cpu")
        if len(kinds) != 1:
            given = ", ".join(kinds) if kinds else "nothing"
            raise RequestError(
                f"request for job '{self.job}' must give exactly one of gpus, count or cpu "
                f"(got {given})"
            )
        if self.gpus is not None:
            _check_gpu_list(self.job, self.gpus)
        if self.count is not None and self.count < 1:
            raise RequestError(f"job '{self.job}' asks for count={self.count}; count must be >= 1")
        if self.slots is not None and not 1 <= self.slots <= MAX_SLOTS:
            raise RequestError(f"job '{self.job}' asks for slots={self.slots}; 1-{MAX_SLOTS}")
        if self.slots is not None and self.cpu:
            raise RequestError(f"job '{self.job}': slots= is for GPUs, not for cpu")

    def describe(self) -> str:
        """The request as an operator would type it (``gpus=1,3``, ``count=2 slots=2``, ``cpu``)."""
        if self.gpus is not None:
            asked = "gpus=" + ",".join(str(g) for g in self.gpus)
        elif self.count is not None:
            asked = f"count={self.count}"
        else:
            return "cpu"
        extra = f" slots={self.slots}" if self.slots is not None else ""
        return asked + extra + (" prefer=links" if self.prefer == "links" else "")


def _check_gpu_list(job: str, gpus: tuple[int, ...]) -> None:
    if not gpus:
        raise RequestError(f"job '{job}' asks for an empty GPU list; use cpu for no GPU")
    negative = sorted(g for g in gpus if g < 0)
    if negative:
        raise RequestError(f"job '{job}' asks for GPU {negative[0]}; GPU indices start at 0")
    repeated = sorted(g for g, times in Counter(gpus).items() if times > 1)
    if repeated:
        listed = ", ".join(str(g) for g in repeated)
        raise RequestError(f"job '{job}' lists GPU {listed} more than once")


def pool_sharing(policy: Policy, host: str) -> Sharing:
    """How the GPUs of ``host`` are shared (exclusive for a host in no pool)."""
    pool = policy.pool_of(host)
    return pool.sharing if pool is not None else Sharing()


class Ask(Struct, frozen=True):
    """What a request takes of each GPU: ``slots`` of it, or all of it (``exclusive``)."""

    slots: int = 1
    exclusive: bool = False


def ask_of(policy: Policy, request: Request, gpus: int) -> Ask:
    """The hold ``request`` asks for, refusing what the pool or the job rules out."""
    sharing, job = pool_sharing(policy, request.host), policy.jobs.get(request.job)
    exclusive = job is not None and job.exclusive and sharing.shared
    where = f"pool of {request.host}"
    if request.slots is not None and not sharing.shared:
        raise RequestError(f"slots= is for shared pools; the {where} gives whole GPUs")
    if request.slots is not None and exclusive:
        raise RequestError(f"job '{request.job}' takes GPUs whole (exclusive: true); no slots=")
    slots = request.slots or 1
    if sharing.capacity is not None and slots > sharing.capacity:
        raise RequestError(
            f"job '{request.job}' asks for {slots} slots; "
            f"the {where} has {sharing.capacity} per GPU"
        )
    # A torchrun worker is one process tree given every GPU, with one MPS pipe: like single.
    single = job is not None and job.workers in ("single", "torchrun")
    if sharing.mode == "mps" and not exclusive and single and gpus > 1:
        raise RequestError(
            f"job '{request.job}' runs one worker, and under MPS a worker uses one GPU (one "
            f"control daemon per GPU): ask for one GPU, or give the job workers: per-gpu"
        )
    return Ask(slots, exclusive)


def describe_request(request: Request) -> str:
    """The request as the operator typed it: ``gpus=1,3``, ``count=2 slots=2`` or ``gpus=cpu``."""
    return "gpus=cpu" if request.cpu else request.describe()
