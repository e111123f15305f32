"""Everything :func:`allocator.agent.planning.desired.desired_jobs` reads, as one value.

The agent recomputes the desired jobs only when this value changes, so the
value is also the cache key: a new input is a new field here, and the key
cannot miss it. Mappings are copied and frozen when the value is made (the
agent keeps changing its own dicts), so a value never changes after it is
compared.

Two fields stand in the key for another: the policy by its ``policy_sha``
(comparing whole policies every tick would cost more than it saves), and the
clock by the ``reservations`` in force then (the only thing the clock
decides), so that the value does not change every tick.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from types import MappingProxyType

from allocator.agent.planning.across_hosts import PeerHost
from allocator.agent.planning.types import Pin
from allocator.policy.model import Policy
from allocator.records.gpu_info import GpuInfo
from allocator.records.types import Assignment

__all__ = ["DEFAULT_MASTER_ADDR", "DesiredInputs"]

#: MASTER_ADDR of a single-host per-gpu job unless the agent's config says otherwise.
DEFAULT_MASTER_ADDR = "127.0.0.1"


@dataclass(frozen=True)
class DesiredInputs:
    """What should run on ``host`` follows from these alone (see :func:`desired_jobs`).

    ``failed`` maps a job to the assignment revision at which a ``fail``
    fallback rule marked it failed. ``now`` is the agent's clock, which judges
    reservation windows; ``reservations`` are those in force then.
    ``holders`` are the GPUs each job's live workers run on; ``pinned`` jobs
    are held in their fallback by the flap limit; ``ports`` are the agent's
    MASTER_PORTs. ``peers`` are the other hosts of this host's jobs across
    hosts and ``address`` the address this agent advertises. ``allowed_cpus``
    are the CPUs workers may be pinned to (none: no pinning); ``mps_dir`` is
    where the agent runs its MPS control daemons. ``vendor`` is whose GPUs the
    host has (:mod:`allocator.gpus.vendors.registry`), which says how a worker is shown its own.
    """

    policy: Policy = field(compare=False)  # in the key as policy_sha
    host: str
    assignments: Mapping[str, Assignment]
    assignment_revisions: Mapping[str, int]
    inventory: Sequence[GpuInfo] | None
    unhealthy: Mapping[int, str]
    failed: Mapping[str, int]
    now: datetime | None = field(default=None, compare=False)  # in the key as reservations
    policy_sha: str = ""
    reservations: tuple[str, ...] = ()
    holders: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    pinned: Mapping[str, Pin] = field(default_factory=dict)
    ports: Mapping[str, int] = field(default_factory=dict)
    master_addr: str = DEFAULT_MASTER_ADDR
    peers: Mapping[str, PeerHost] = field(default_factory=dict)
    address: str | None = None
    allowed_cpus: frozenset[int] = frozenset()
    mps_dir: str | None = None
    vendor: str = "nvidia"
    host_named: bool = True  # the applied policy names the host (else nothing runs here)

    def __post_init__(self) -> None:
        """Freeze every mapping (a copy) and the inventory, so the value never changes."""
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, Mapping) and not isinstance(value, MappingProxyType):
                object.__setattr__(self, item.name, MappingProxyType(dict(value)))
        if self.inventory is not None and not isinstance(self.inventory, tuple):
            object.__setattr__(self, "inventory", tuple(self.inventory))

    def __hash__(self) -> int:
        """A hash over the key's fields (mappings by their items; a peer and a pin by name)."""
        return hash(
            (
                self.policy_sha,
                self.host,
                frozenset(self.assignments.items()),
                frozenset(self.assignment_revisions.items()),
                self.inventory,
                frozenset(self.unhealthy.items()),
                frozenset(self.failed.items()),
                self.reservations,
                frozenset(self.holders.items()),
                frozenset(self.pinned),
                frozenset(self.ports.items()),
                self.master_addr,
                frozenset(self.peers),
                self.address,
                self.allowed_cpus,
                self.mps_dir,
                self.vendor,
            )
        )
