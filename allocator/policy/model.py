"""The policy as frozen, typed objects.

These are produced only by :func:`allocator.policy.load_policy`, which has
already validated every cross-reference, so code that receives a
:class:`Policy` can trust it (every job's fallback rule exists, every
reservation's GPUs exist on its host, and so on).

They are msgspec Structs, not dataclasses: defining a dataclass costs about
half a millisecond of every process that imports it, a Struct a hundredth
of that, and ``allocator set`` imports these. A compiled policy
(:mod:`allocator.policy.compiled`) decodes straight into them, and is
encoded without the fields that hold their defaults. Copies with changes:
``msgspec.structs.replace``. No ``from __future__ import annotations``
here: msgspec would then evaluate every annotation's text when it first
decodes a compiled policy, a millisecond of every ``set``.
"""

import fnmatch
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Literal

from msgspec import Struct, field

# The policy's default XIDs are a policy default, kept with the vendor-neutral health
# records (where every monitor starts from them too), so the policy loads no vendor.
from allocator.gpus.health import DEFAULT_IGNORED_XIDS

__all__ = [
    "DEFAULT_HISTORY_BYTES",
    "DEFAULT_IGNORED_XIDS",
    "Container",
    "FairShare",
    "FallbackRule",
    "HealthSettings",
    "HistorySettings",
    "Host",
    "IdleRule",
    "Job",
    "Policy",
    "Pool",
    "PriorityRule",
    "Quota",
    "Reservation",
    "Sharing",
    "Team",
]

SharingMode = Literal["exclusive", "time-slice", "mps"]
CpuAffinity = Literal["local", "none"]
FallbackAction = Literal["cpu", "wait", "fail"]
WorkerMode = Literal["single", "per-gpu", "torchrun"]
RestartRule = Literal["always", "on-failure", "never"]
VisibleDevices = Literal["uuid", "index"]
IdleAction = Literal["warn", "release", "none"]
ContainerEngine = Literal["podman", "docker"]
ContainerDevices = Literal["cdi", "gpus"]
CdiNames = Literal["card", "pci"]


class IdleRule(Struct, frozen=True, omit_defaults=True):
    """When a job holding GPUs counts as an idle holder, and what then happens.

    A GPU is idle while its utilization is under ``threshold_percent``; a
    job is idle once all its GPUs have been for ``after_seconds``.
    ``warn`` shows it in ``status``; ``release`` also releases it; ``none``
    exempts a job from its pool's rule. With ``busy_cpu_percent``, a sample
    where the job's processes used at least that share of the host's CPU
    counts as busy (a data-loading or checkpoint phase).
    """

    after_seconds: float | None = None
    action: IdleAction = "warn"
    threshold_percent: float = 5.0
    busy_cpu_percent: float | None = None


class Host(Struct, frozen=True, omit_defaults=True):
    """A host and its declared GPU count (used where NVML is absent)."""

    name: str
    gpus: int
    pool: str | None = None
    vendor: str | None = None  # nvidia, amd, intel, apple; None: the pool's, or any
    cdi_names: CdiNames | None = None  # how its CDI spec names Intel GPUs; None: the pool's


class Sharing(Struct, frozen=True, omit_defaults=True):
    """How a pool's GPUs are shared: whole (``exclusive``) or in ``slots`` per GPU.

    ``time-slice``: up to ``slots`` jobs on a GPU at once, taking turns on it
    as CUDA does for any processes; ``mps``: the same, through one NVIDIA MPS
    control daemon per GPU, each job limited to its share of the SMs and the
    memory. ``slots=None`` with ``time-slice`` is the old ``sharing: shared``:
    any number of jobs, no share known.
    """

    mode: SharingMode = "exclusive"
    slots: int | None = None

    @property
    def shared(self) -> bool:
        """Whether more than one job may hold a GPU."""
        return self.mode != "exclusive"

    @property
    def capacity(self) -> int | None:
        """Slots per GPU: 1 when exclusive, ``None`` when unlimited."""
        return 1 if self.mode == "exclusive" else self.slots


class Pool(Struct, frozen=True, omit_defaults=True):
    """A group of hosts sharing placement rules."""

    name: str
    hosts: tuple[str, ...] = ()
    sharing: Sharing = Sharing()
    max_gpus_per_job: int | None = None
    idle: IdleRule | None = None
    vendor: str | None = None  # the vendor of every host of the pool
    cdi_names: CdiNames | None = None  # how its hosts' CDI specs name Intel GPUs
    default_time: float | None = None  # seconds a job may run when it asks for no time=
    max_time: float | None = None  # the most seconds a job may ask for with time=


class Reservation(Struct, frozen=True, omit_defaults=True):
    """GPUs on one host kept during a window for jobs matching ``for_jobs`` or for ``who``.

    Job-name globs admit an operator's ``set``; a self-service request
    (``run``, ``lease()``, whose job name its asker picks) is admitted only
    by ``who`` (subjects: ``user:``, ``team:``, ``unix:``), as is anyone's.
    """

    name: str
    host: str
    gpus: tuple[int, ...]
    for_jobs: tuple[str, ...] = ()
    start: datetime | None = None
    until: datetime | None = None
    who: tuple[str, ...] = ()

    def active(self, now: datetime) -> bool:
        """Whether the reservation applies at ``now`` (start inclusive, until exclusive)."""
        if self.start is not None and now < self.start:
            return False
        return not (self.until is not None and now >= self.until)

    def admits(self, job: str, asker: Sequence[str] = (), *, self_service: bool = False) -> bool:
        """Whether a request for ``job`` by subjects ``asker`` may use the reserved GPUs."""
        if not self.who_set.isdisjoint(asker):
            return True
        return not self_service and any(fnmatch.fnmatchcase(job, p) for p in self.for_jobs)

    @property
    def who_set(self) -> frozenset[str]:
        """``who`` as a set."""
        return frozenset(self.who)


class FallbackRule(Struct, frozen=True, omit_defaults=True):
    """What happens to a job when its GPUs are unavailable."""

    name: str
    action: FallbackAction
    threads: int | None = None


class Container(Struct, frozen=True, omit_defaults=True):
    """A job's workers run as containers of ``image`` (see docs/containers.md).

    ``devices``: ``cdi`` names each GPU by its CDI name (``nvidia.com/gpu=UUID``);
    ``gpus`` uses docker's ``--gpus`` (NVIDIA's container toolkit, no CDI).
    ``None``: ``gpus`` under docker on an NVIDIA host, else ``cdi`` (docker's
    ``--gpus`` reaches only NVIDIA's toolkit; docker 25 and later take CDI names).
    """

    image: str
    engine: ContainerEngine = "podman"
    args: tuple[str, ...] = ()
    mounts: tuple[str, ...] = ()
    devices: ContainerDevices | None = None

    def device_naming(self, vendor: str) -> ContainerDevices:
        """How the engine is told a ``vendor``'s devices: the field, else the engine's usual way."""
        if self.devices is not None:
            return self.devices
        from allocator.gpus.vendors.registry import VENDORS  # loads no device library

        devices = VENDORS.get(vendor)
        docker_gpus = devices is not None and devices.docker_gpus
        return "gpus" if self.engine == "docker" and docker_gpus else "cdi"


class Job(Struct, frozen=True, omit_defaults=True):
    """A job the agent may run: its command comes from here, never from a request."""

    name: str
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    workers: WorkerMode = "single"
    on_change: str = "restart"  # restart | none | signal:<SIGNAME>
    grace_seconds: float = 10.0
    fallback: str | None = None
    allow_adhoc_command: bool = False
    max_restarts: int = 5
    restart_backoff_seconds: float = 1.0
    restart_backoff_max_seconds: float = 60.0
    user: str | None = None  # run the workers as this user (name or uid); None: as the agent
    group: str | None = None  # and this group; None: the user's primary group
    exclusive: bool = False  # whole GPUs even in a shared pool
    cpu_affinity: CpuAffinity = "local"  # pin workers to their GPUs' CPUs; "none": don't
    idle: IdleRule | None = None  # overrides the pool's rule
    mix_vendors: bool = False  # may one job across hosts hold GPUs of several vendors
    # When workers that ended by themselves start again: "on-failure" (the
    # default, what the agent always did) restarts only a non-zero exit.
    restart: RestartRule = "on-failure"
    # Exit statuses at which the agent releases the job's GPUs (): never.
    release_on_exit: tuple[int, ...] = ()
    container: Container | None = None  # run each worker as a container of this image


class HealthSettings(Struct, frozen=True, omit_defaults=True):
    """GPU health tuning."""

    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    interval_seconds: float = 5.0
    recovery_probe: tuple[str, ...] | None = None
    recovery_probe_timeout_seconds: float = 60.0
    hold_down_seconds: float = 10.0
    hold_down_max_seconds: float = 300.0
    flap_restart_limit: int = 4


#: The store bytes all history may take: a quarter of etcd's default 2 GiB quota.
DEFAULT_HISTORY_BYTES = 512 * 1024**2


class HistorySettings(Struct, frozen=True, omit_defaults=True):
    """How much assignment history the store keeps.

    ``entries_per_host`` not written in the policy: the most entries (up to
    1,000) the fleet's streams can keep within ``max_bytes`` (see
    :mod:`allocator.policy.history_field`). ``max_age_seconds``: entries
    older than this are dropped by the next append (``None``: kept until
    the count drops them).
    """

    entries_per_host: int = 1000
    max_age_seconds: float | None = None
    max_bytes: int = DEFAULT_HISTORY_BYTES


class Team(Struct, frozen=True, omit_defaults=True):
    """A named group of users, for quotas and priorities (``team:NAME``).

    ``operators``: users who may change or release what the members hold.
    """

    name: str
    members: tuple[str, ...] = ()
    operators: tuple[str, ...] = ()


class Quota(Struct, frozen=True, omit_defaults=True):
    """The most a subject may hold at once: ``user:NAME``, ``team:NAME`` or ``unix:GROUP``.

    ``gpus``: GPUs held whole; ``slots``: slots held of shared GPUs; each
    ``None`` when unlimited. ``pools``: count only GPUs of these pools (all
    when empty).
    """

    who: str
    gpus: int | None = None
    slots: int | None = None
    pools: tuple[str, ...] = ()


class PriorityRule(Struct, frozen=True, omit_defaults=True):
    """The wait-queue priority of the requests of ``who`` (subjects) or of ``jobs`` (globs)."""

    priority: int
    who: tuple[str, ...] = ()
    jobs: tuple[str, ...] = ()


class FairShare(Struct, frozen=True, omit_defaults=True):
    """The wait queue's fair share: equal priorities ordered by recent usage (docs/queue.md).

    ``half_life_seconds``: usage this old counts half; ``halve_at``: the
    decayed GPU-hours that halve a request's factor (Slurm's shares);
    ``team_weight``: how much of the holder's teams' usage counts as theirs.
    """

    half_life_seconds: float
    halve_at: float = 100.0
    team_weight: float = 0.0


class Policy(Struct, frozen=True, omit_defaults=True):
    """A validated policy file."""

    version: int
    hosts: Mapping[str, Host] = field(default_factory=dict)
    pools: Mapping[str, Pool] = field(default_factory=dict)
    reservations: tuple[Reservation, ...] = ()
    jobs: Mapping[str, Job] = field(default_factory=dict)
    fallback: Mapping[str, FallbackRule] = field(default_factory=dict)
    visible_devices: VisibleDevices = "uuid"
    health: HealthSettings = field(default_factory=HealthSettings)
    history: HistorySettings = field(default_factory=HistorySettings)
    teams: Mapping[str, Team] = field(default_factory=dict)
    quotas: tuple[Quota, ...] = ()
    priorities: tuple[PriorityRule, ...] = ()
    fair_share: FairShare | None = None
    operators: tuple[str, ...] = ()
    #: Users whose submitted jobs an agent running as root may run as root (docs/submit.md).
    submit_as_root: tuple[str, ...] = ()
    #: Not a policy setting: the fleet's size, which ``policy apply`` writes in the
    #: common share (every agent reads it, and paces its idle store traffic by it:
    #: ``agent/sync/pacing.py``). 0 in a policy as loaded.
    fleet_hosts: int = 0

    def vendor_of(self, host: str) -> str | None:
        """The GPU vendor the policy says ``host`` has (its own, else its pool's)."""
        declared = self.hosts.get(host)
        if declared is not None and declared.vendor is not None:
            return declared.vendor
        pool = self.pool_of(host)
        return pool.vendor if pool is not None else None

    def cdi_names_of(self, host: str) -> CdiNames:
        """How ``host``'s CDI spec names its GPUs where the vendor has two namings
        (its own say, else its pool's, else ``card``, Intel's generator's default)."""
        declared = self.hosts.get(host)
        if declared is not None and declared.cdi_names is not None:
            return declared.cdi_names
        pool = self.pool_of(host)
        return pool.cdi_names if pool is not None and pool.cdi_names is not None else "card"

    def names_host(self, host: str) -> bool:
        """Whether ``host`` is one of the policy's: in ``hosts``, a pool or a reservation.

        A policy that names hosts takes no assignment on another and runs
        nothing there, even with an agent reporting its GPUs (a host removed,
        or never added); one that names no host at all goes by the GPUs the
        agents report, on any host.
        """
        if host in self.hosts or self.pool_of(host) is not None:
            return True
        if any(reservation.host == host for reservation in self.reservations):
            return True
        return not (self.hosts or self.reservations or any(p.hosts for p in self.pools.values()))

    def pool_of(self, host: str) -> Pool | None:
        """Return the pool ``host`` belongs to, if any."""
        declared = self.hosts.get(host)
        if declared is not None and declared.pool is not None:
            return self.pools.get(declared.pool)
        for pool in self.pools.values():
            if host in pool.hosts:
                return pool
        return None

    def idle_rule(self, job: str, host: str) -> tuple[IdleRule, str] | None:
        """The idle rule in force for ``job`` on ``host`` and where it comes from.

        The job's own rule wins over its host's pool's; ``None`` when neither
        has one, or the one in force is ``action: none``.
        """
        spec = self.jobs.get(job)
        pool = self.pool_of(host)
        if spec is not None and spec.idle is not None:
            rule, source = spec.idle, f"job {job}"
        elif pool is not None and pool.idle is not None:
            rule, source = pool.idle, f"pool {pool.name}"
        else:
            return None
        return None if rule.action == "none" else (rule, source)

    def fallback_for(self, job: str) -> FallbackRule | None:
        """Return the fallback rule of a declared job, if it names one."""
        spec = self.jobs.get(job)
        if spec is None or spec.fallback is None:
            return None
        return self.fallback.get(spec.fallback)
