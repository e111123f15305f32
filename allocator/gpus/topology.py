"""How GPUs connect to each other and to CPUs: PCIe levels and CPU lists (pure).

A vendor's library reports the PCIe path between two GPUs as the level of their
closest common ancestor (NVML's ``nvmlDeviceGetTopologyCommonAncestor``, whose
codes :mod:`allocator.gpus.vendors.nvidia.nvml_codes` maps to level names) and
the CPUs close to a GPU as a bitmask (``nvmlDeviceGetCpuAffinity``). The agent
publishes them as level names and Linux CPU lists (``0-27,56-83``), which people
can read in ``allocator doctor`` and in the store.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from allocator.records.fields import PCIE_LEVELS, PcieLevel
from allocator.records.gpu_info import GpuInfo

__all__ = [
    "GROUP_LEVELS",
    "LEVEL_WORDS",
    "Links",
    "cpu_list",
    "cpus_from_mask",
    "parse_cpu_list",
]

#: What each level means, for ``picked 0,1: same PCIe switch``.
LEVEL_WORDS: dict[PcieLevel, str] = {
    "board": "same board",
    "switch": "same PCIe switch",
    "switches": "same PCIe switch tree",
    "host-bridge": "same PCIe host bridge",
    "node": "same NUMA node",
    "system": "across CPU sockets",
}
#: The levels that group GPUs, coarsest first: a set within one group of a level is
#: connected at that level or better (PCIe is a tree, so these groups nest).
GROUP_LEVELS: tuple[PcieLevel, ...] = ("node", "host-bridge", "switches", "switch", "board")
#: Bits in one word of NVML's CPU mask (an array of C unsigned longs; 64-bit Linux).
_WORD_BITS = 64
#: No machine has more CPUs than this; a bigger number is a broken mask.
_MAX_CPU = 1 << 20


def cpus_from_mask(words: Sequence[int]) -> frozenset[int]:
    """The CPUs set in NVML's CPU mask: bit ``b`` of word ``w`` is CPU ``64 * w + b``."""
    cpus: set[int] = set()
    for position, word in enumerate(words):
        value = int(word)
        bit = 0
        while value:
            if value & 1:
                cpus.add(position * _WORD_BITS + bit)
            value >>= 1
            bit += 1
    return frozenset(cpus)


def cpu_list(cpus: Iterable[int]) -> str:
    """A Linux CPU list: ``0-3,8`` for {0, 1, 2, 3, 8}; ``""`` for none."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def parse_cpu_list(text: str) -> frozenset[int]:
    """The CPUs of a Linux CPU list (``0-3,8``); ``ValueError`` if it is not one."""
    cpus: set[int] = set()
    for part in text.split(",") if text else ():
        low, dash, high = part.partition("-")
        first = _cpu(low, text)
        last = _cpu(high, text) if dash else first
        if last < first:
            raise ValueError(f"CPU list {text!r}: range {part!r} runs backwards")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def _cpu(token: str, text: str) -> int:
    if not token.isascii() or not token.isdigit() or int(token) > _MAX_CPU:
        raise ValueError(f"{text!r} is not a CPU list (like 0-3,8)")
    return int(token)


@dataclass(frozen=True, slots=True)
class Links:
    """How a host's GPUs connect, from its inventory: NVLink peers and PCIe/NUMA groups.

    ``groups`` holds, for each level of :data:`GROUP_LEVELS` anything is known
    about, the group of every GPU (GPUs in one group are connected at that
    level or better; a GPU missing from the mapping is unknown). ``numa`` is
    each GPU's NUMA node where NVML gave one.
    """

    peers: Mapping[int, frozenset[int]]
    groups: tuple[tuple[PcieLevel, Mapping[int, Hashable]], ...]
    numa: Mapping[int, int]

    @classmethod
    def of(cls, inventory: Sequence[GpuInfo] | None) -> Links:
        """The facts of an inventory (none for ``None``); linear unless it has PCIe levels."""
        gpus = inventory or ()
        peers: dict[int, set[int]] = {}
        for gpu in gpus:
            for peer in gpu.nvlink_peers:
                if peer != gpu.index:  # links are symmetric, whichever side reports them
                    peers.setdefault(gpu.index, set()).add(peer)
                    peers.setdefault(peer, set()).add(gpu.index)
        numa = {g.index: g.numa_node for g in gpus if g.numa_node is not None}
        groups: list[tuple[PcieLevel, Mapping[int, Hashable]]] = []
        with_levels = [g for g in gpus if g.pcie_levels]
        for level in GROUP_LEVELS:
            if level == "node" and numa:
                groups.append((level, numa))
            elif with_levels:
                groups.append((level, _groups_at(with_levels, level)))
        frozen = {gpu: frozenset(linked) for gpu, linked in peers.items()}
        return cls(peers=frozen, groups=tuple(groups), numa=numa)

    def nvlink_pairs(self, chosen: Sequence[int]) -> int:
        """How many pairs of ``chosen`` are NVLinked."""
        members = set(chosen)
        return sum(len(self.peers.get(g, frozenset()) & members) for g in chosen) // 2

    def spans(self, chosen: Sequence[int]) -> tuple[int, ...]:
        """Groups ``chosen`` spans at each known level, coarsest first (fewer is better)."""
        return tuple(len({labels.get(g) for g in chosen}) for _, labels in self.groups)

    def describe(self, chosen: Sequence[int]) -> str:
        """How ``chosen`` is connected: ``NVLink pair``, ``same PCIe switch``, ... ("" for one)."""
        count = len(chosen)
        if count < 2:
            return ""
        linked, pairs = self.nvlink_pairs(chosen), math.comb(count, 2)
        if linked == pairs:
            return "NVLink pair" if count == 2 else f"all {count} NVLink-connected"
        words = self._pcie_words(chosen)
        return f"{words}; {linked} of {pairs} pairs NVLinked" if linked else words

    def _pcie_words(self, chosen: Sequence[int]) -> str:
        for level, labels in reversed(self.groups):  # the finest level they share
            shared = {labels.get(g) for g in chosen}
            if len(shared) == 1 and None not in shared:
                nodes = {self.numa[g] for g in chosen if g in self.numa}
                node = f" {nodes.pop()}" if level == "node" and len(nodes) == 1 else ""
                return LEVEL_WORDS[level] + node
        nodes_spanned = self.sockets(chosen)
        if nodes_spanned:
            return "across NUMA nodes " + ",".join(map(str, nodes_spanned))
        return LEVEL_WORDS["system"] if self.groups else "no topology known"

    def crosses_sockets(self, chosen: Sequence[int]) -> bool:
        """Whether ``chosen`` spans NUMA nodes (CPU sockets), as far as the host says."""
        for level, labels in self.groups:
            if level == "node":
                return len({labels.get(g) for g in chosen} - {None}) > 1
        return False

    def sockets(self, chosen: Sequence[int]) -> tuple[int, ...]:
        """The NUMA nodes ``chosen`` spans when it spans more than one (else ``()``)."""
        nodes = sorted({self.numa[g] for g in chosen if g in self.numa})
        return tuple(nodes) if len(nodes) > 1 else ()


def _groups_at(gpus: Sequence[GpuInfo], level: PcieLevel) -> dict[int, Hashable]:
    """Each GPU's group at ``level``: the lowest index it connects to at that level or better."""
    limit = PCIE_LEVELS.index(level)
    labels: dict[int, Hashable] = {}
    for gpu in gpus:
        close = [
            peer
            for peer, between in enumerate(gpu.pcie_levels)
            if between is not None and PCIE_LEVELS.index(between) <= limit
        ]
        labels[gpu.index] = min([gpu.index, *close])
    return labels
