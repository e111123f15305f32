"""Stored records: typed structs, strictly decoded, checked against the key they live at.

Anything can be written into a store by hand (``etcdctl put``), so nothing read
back is trusted: :func:`decode_record` checks JSON syntax, every field's type
and range, ``schema_version``, and that the names in the body agree with the
key (a record under ``jobs/ghost`` whose body says ``train`` is not ``train``).
A record that fails raises :class:`BadRecord`; callers skip it and report it,
never crash on it.

The GPU description an agent publishes is :mod:`allocator.records.gpu_info`.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from allocator.records.codec import decode_record, encode_record
from allocator.records.fields import (
    SCHEMA_VERSION,
    Address,
    Argument,
    Count,
    GpuIndex,
    Name,
    Nodes,
    Port,
    Rfc3339,
    Sha256,
    Slots,
    Text,
)
from allocator.records.gpu_info import GpuInfo
from allocator.util.digest import sha256_hex

__all__ = [
    "AgentRecord",
    "Assignment",
    "CompiledPolicyRecord",
    "GpuProcess",
    "HistoryEntry",
    "HistoryHead",
    "JobIndex",
    "JobPlace",
    "LaunchedBy",
    "PolicyRecord",
    "RunHolder",
    "WorkerRecord",
]


#: What holds an assignment under a store lease: ``allocator run``, ``allocator.lease()``,
#: or the host's agent for a job ``allocator submit`` queued.
LaunchedBy = Literal["run", "lease", "submit"]


class RunHolder(msgspec.Struct, frozen=True):
    """The process that holds an assignment: ``allocator run``, ``lease()``, or the agent.

    Such an assignment lives by its store lease: it disappears when the
    process stops refreshing it. The agent counts its GPUs as held and the
    process tree below ``pid`` (started at ``start_ticks``, ``/proc``'s
    field 22) as their legitimate user; it never starts it, and stops what is
    left of it once the holding ends (:mod:`allocator.records.holding`).
    """

    pid: Count
    start_ticks: Count | None = None
    ttl: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 15.0
    launched_by: LaunchedBy = "run"


class Assignment(msgspec.Struct, frozen=True):
    """Which GPUs a job holds on a host (``mode="cpu"``: it holds none, runs on CPU).

    A share of a job across several hosts names all of them in ``nodes`` (node
    rank = position; the first runs rank 0) and the job's one ``master_port``;
    every share is written in one transaction, so they always agree.
    In a shared pool the job holds ``slots`` of each GPU's slots; ``exclusive``
    says it holds the GPUs whole (a job the policy marks ``exclusive: true``).
    ``picked`` is why ``count=N`` chose these GPUs (``NVLink pair``).
    """

    job: Name
    host: Name
    gpus: tuple[GpuIndex, ...]
    mode: Literal["gpu", "cpu"]
    updated_by: Text
    updated_at: Text
    reason: Text = ""
    requested: Text = ""
    policy_revision: Count = 0
    command: Annotated[tuple[Argument, ...], msgspec.Meta(max_length=4096)] | None = None
    fallback_reason: Text | None = None
    nodes: Nodes = ()
    master_port: Port | None = None
    slots: Slots = 1
    exclusive: bool = False
    picked: Text = ""
    #: Who holds it (:mod:`allocator.control.holder`): the store's user, else the OS user.
    holder: Text = ""
    #: The quota counters (``user/alice``, ``team/a``) this assignment was counted in;
    #: its release gives back to exactly these (:mod:`allocator.control.quotas`).
    charged: Annotated[tuple[Text, ...], msgspec.Meta(max_length=64)] = ()
    run: RunHolder | None = None
    #: The holder's subjects that the policy's reservations named when it was
    #: written (``team:infra``, ``unix:gpu``): a reservation's ``who`` admits by them.
    asker: Annotated[tuple[Text, ...], msgspec.Meta(max_length=64)] = ()
    #: When its time limit ends (RFC 3339 UTC, absolute so any reader sees it; ``""``:
    #: no limit). :mod:`allocator.placement.time_limit` computes it and says when it has come.
    ends_at: Text = ""
    #: ``--preemptible``: a normal request that needs its GPUs takes them back
    #: (:mod:`allocator.placement.preemption`).
    preemptible: bool = False
    #: Set once a normal request needs its GPUs: that request's job, and when
    #: (RFC 3339 UTC). Its holder stops it (SIGTERM, its grace) and releases it.
    preempted_by: Text = ""
    preempted_at: Text = ""
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.nodes:
            _check_nodes(self.nodes, self.master_port)
            if self.host not in self.nodes:
                raise ValueError(f"host {self.host!r} is not one of its nodes {list(self.nodes)}")

    @property
    def node_rank(self) -> int:
        """This share's node rank (0 for a job on one host)."""
        return self.nodes.index(self.host) if self.nodes else 0

    def to_json(self) -> bytes:
        """Encode for the store."""
        return encode_record(self)

    @classmethod
    def from_json(cls, raw: bytes) -> Assignment:
        """Decode a stored assignment (``BadRecord`` if it is not one)."""
        return decode_record(raw, cls)


class PolicyRecord(msgspec.Struct, frozen=True):
    """The applied policy: its YAML text, hash, and who applied it when."""

    yaml: str
    sha256: Sha256
    applied_by: Text
    applied_at: Text
    source: Text = ""
    #: When this policy was applied, every job holding GPUs had its job index
    #: entry (:mod:`allocator.control.job_index`): a job without one holds nothing, so
    #: a new job's first ``set`` need not search every host for it.
    job_index: bool = False
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        actual = sha256_hex(self.yaml.encode("utf-8", "surrogatepass"))
        if actual != self.sha256:
            raise ValueError("sha256 does not match the policy text (edited by hand?)")

    def to_json(self) -> bytes:
        """Encode for the store."""
        return encode_record(self)

    @classmethod
    def from_json(cls, raw: bytes) -> PolicyRecord:
        """Decode a stored policy record (``BadRecord`` if it is not one)."""
        return decode_record(raw, cls)


class CompiledPolicyRecord(msgspec.Struct, frozen=True):
    """The applied policy as the loader built it, stored next to its YAML by ``policy apply``.

    ``sha256`` is the YAML text's (as in :class:`PolicyRecord`), ``format``
    says which loader built it; ``policy`` is decoded only by a reader whose
    own format is the same (:mod:`allocator.policy.compiled`).
    """

    sha256: Sha256
    format: Text
    policy: msgspec.Raw
    schema_version: int = SCHEMA_VERSION
    #: When ``parts`` > 0 the policy is too large for this record: ``policy`` is
    #: ``null`` and its JSON is in that many part keys, each named by the
    #: SHA-256 of its value (``part_sha256``, in order); ``body_sha256`` is the
    #: whole JSON's, checked when the parts are joined.
    parts: int = 0
    body_sha256: Sha256 | None = None
    part_sha256: tuple[Sha256, ...] = ()

    def to_json(self) -> bytes:
        """Encode for the store."""
        return encode_record(self)


class GpuProcess(msgspec.Struct, frozen=True):
    """A process NVML lists on a GPU that no job was given (see ``AgentRecord.unassigned``).

    ``job`` names the job whose process tree it belongs to when it is one of
    the agent's own workers on a GPU that job does not hold; ``None`` for a
    process from outside the allocator. ``user`` and ``command`` are empty
    when the agent cannot see the process (another PID namespace).
    ``memory_used_mib`` moves only by a significant step, so the agent
    record is not rewritten for every MiB a process allocates.
    """

    gpu: GpuIndex
    pid: Count
    user: Text = ""
    command: Text = ""
    memory_used_mib: Count | None = None
    job: Name | None = None


class AgentRecord(msgspec.Struct, frozen=True):
    """What a host agent publishes under its lease: inventory and health.

    Liveness is the lease (the key exists while the agent keeps it alive),
    not a timestamp: comparing clocks across machines misjudges skewed hosts,
    and a record rewritten on every heartbeat fills etcd's history. The
    record changes only when its content does. ``store_stale`` says the agent
    can keep its lease but cannot read its assignments (its view may be old).
    ``address`` is where other hosts reach this one: the ``MASTER_ADDR`` of a
    job across several hosts whose node rank 0 runs here.
    """

    host: Name
    gpus: tuple[GpuInfo, ...]
    unhealthy: dict[GpuIndex, Text] = {}
    started_at: Text = ""
    pid: Count = 0
    version: Text = ""
    store_stale: bool = False
    inventory_source: Text = "nvml"
    address: Address | None = None
    unassigned: Annotated[tuple[GpuProcess, ...], msgspec.Meta(max_length=4096)] = ()
    #: Whose GPUs the agent found (nvidia, amd, intel, apple); "" from agents before vendors.
    vendor: Text = ""
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> bytes:
        """Encode for the store."""
        return encode_record(self)

    @classmethod
    def from_json(cls, raw: bytes) -> AgentRecord:
        """Decode a stored agent record (``BadRecord`` if it is not one)."""
        return decode_record(raw, cls)


#: A failed worker's last lines: at most 10 (the agent keeps 2 KiB of them in all).
OutputTail = Annotated[tuple[Text, ...], msgspec.Meta(max_length=10)]


class WorkerRecord(msgspec.Struct, frozen=True):
    """What the agent actually runs for one job.

    ``master_addr``/``master_port`` are the rendezvous its per-gpu workers were
    given (``allocator env`` shows them), ``None`` for other jobs. ``fault`` is
    why this host's own GPUs cannot serve the job right now (the job's fallback
    rule is at work because of this host): the other shares of a job across
    several hosts follow it, since a collective cannot run with a missing rank.
    ``idle_since`` is when every GPU of the job last went under the idle
    utilization threshold (RFC 3339, the agent's clock), ``None`` while any
    of them is busy or cannot be measured. ``output_tail`` is the last lines the
    failed worker wrote (bounded, control characters escaped, secrets masked)
    once the agent gave up on the job, and ``log_path`` the log they are from:
    why it gave up. Records written before these fields read as without them.
    """

    job: Name
    host: Name
    state: Text
    pids: tuple[Count, ...] = ()
    gpus: tuple[GpuIndex, ...] = ()
    device: Literal["cuda", "cpu"] = "cuda"
    since: Text = ""
    restarts: Count = 0
    crash_restarts: Count = 0
    last_exit: int | None = None
    fallback_reason: Text | None = None
    message: Text = ""
    start_times: tuple[float, ...] = ()
    assignment_revision: Count = 0
    master_addr: Text | None = None
    master_port: Port | None = None
    fault: Text | None = None
    idle_since: Text | None = None
    output_tail: OutputTail = ()
    log_path: Text | None = None
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> bytes:
        """Encode for the store."""
        return encode_record(self)

    @classmethod
    def from_json(cls, raw: bytes) -> WorkerRecord:
        """Decode a stored worker record (``BadRecord`` if it is not one)."""
        return decode_record(raw, cls)


class JobIndex(msgspec.Struct, frozen=True):
    """The hosts where a job holds an assignment (kept with every assignment change).

    A job across several hosts also has its ``nodes`` in node-rank order and
    its ``master_port`` here: the one record of the job as a whole.
    """

    job: Name
    hosts: tuple[Name, ...]
    nodes: Nodes = ()
    master_port: Port | None = None
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.nodes:
            _check_nodes(self.nodes, self.master_port)

    def to_json(self) -> bytes:
        """Encode for the store."""
        return encode_record(self)


def _check_nodes(nodes: tuple[str, ...], master_port: int | None) -> None:
    """A job's nodes: two or more distinct hosts, with the job's MASTER_PORT."""
    if len(nodes) < 2:
        raise ValueError("nodes must name two or more hosts (or none)")
    if len(set(nodes)) != len(nodes):
        raise ValueError(f"nodes {list(nodes)} name a host twice")
    if master_port is None:
        raise ValueError("a job across several hosts needs its master_port")


#: What a history entry records: lower-case words (see :mod:`allocator.history.stream`);
#: a pattern, not a fixed list, so an entry a newer allocator writes still reads.
HistoryAction = Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z-]{0,31}\Z")]
#: Where a job was before or after a change: on GPUs, on the CPU, or stopped.
JobPlace = Literal["gpu", "cpu", "stopped"]


class HistoryEntry(msgspec.Struct, frozen=True):
    """One change in a host's (or the policy's) history: when, who, what, from where to where.

    ``from_mode``/``to_mode`` are ``None`` where the job held nothing (before
    a first ``set``, after a ``release``); a policy entry names no host or
    job and carries the applied policy's hash (and the one it replaced).
    """

    seq: Count
    at: Rfc3339
    by: Text
    action: HistoryAction
    host: Name | None = None
    job: Name | None = None
    from_mode: JobPlace | None = None
    from_gpus: tuple[GpuIndex, ...] = ()
    to_mode: JobPlace | None = None
    to_gpus: tuple[GpuIndex, ...] = ()
    reason: Text = ""
    detail: Text = ""
    policy_sha256: Sha256 | None = None
    previous_sha256: Sha256 | None = None
    #: Slots of each GPU the job holds after a set or move (``None``: 1, or an older entry).
    slots: Slots | None = None
    #: How a command held by ``allocator run`` ended (a release entry): its exit status
    #: (128+N for death by signal N) and the GPU-seconds it held.
    exit_status: Annotated[int, msgspec.Meta(ge=0, le=255)] | None = None
    gpu_seconds: Annotated[float, msgspec.Meta(ge=0)] | None = None
    #: Who held the job's GPUs (the assignment's ``holder``; "" in older entries).
    holder: Text = ""
    #: When the holding this entry ends began (its assignment's time), its slots per
    #: GPU and who held it: what the usage rollup counts (``None``: nothing held, or
    #: an older entry).
    started: Rfc3339 | None = None
    from_slots: Slots | None = None
    from_holder: Text | None = None
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> bytes:
        """Encode for the store."""
        return encode_record(self)


class HistoryHead(msgspec.Struct, frozen=True):
    """A history stream's bounds: entries ``first`` .. ``next - 1`` exist, at most ``limit``.

    Every append compares this key's revision, so two writers never take one
    sequence number, and the oldest entry to drop is known without a read.
    """

    stream: Text
    first: Count
    next: Count
    limit: Annotated[int, msgspec.Meta(ge=1)]
    schema_version: int = SCHEMA_VERSION
    #: Entries older than this (seconds) go with the next append; ``None``: kept.
    max_age_seconds: Annotated[float, msgspec.Meta(gt=0)] | None = None

    def to_json(self) -> bytes:
        """Encode for the store."""
        return encode_record(self)
