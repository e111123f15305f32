"""Choosing ``count=N`` GPUs among the free ones: which set is best, in time linear in the host.

Sets are ranked by, in order: GPUs a reservation will take from the job
later, NVLink pairs missing, NUMA nodes spanned, other jobs sharing the GPUs
(shared pools), GPUs the job does not already hold (so re-running the same
request does not move, and restart, the job), and finally the lowest indices.

Small choices are exhaustive (every combination scored). Large ones grow a
set greedily from a few seeds; each step takes the GPU that adds least,
from a heap whose entries are updated only for the GPUs a step affects (its
NVLink peers, and the GPUs of a NUMA node when the set first enters it), so a
1,024-GPU host costs O(n log n) per seed, not a rescan per added GPU.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from allocator.gpus.model import GpuInfo

__all__ = ["EXHAUSTIVE_LIMIT", "MAX_SEEDS", "Ranking"]

#: Above this many candidate sets, ``count=N`` uses a greedy search instead of
#: scoring every combination (real hosts have at most 16 GPUs: C(16, 8) = 12870).
EXHAUSTIVE_LIMIT = 20_000
#: Greedy searches started (lowest GPU, the job's own, one per NUMA node up to this).
MAX_SEEDS = 16

Score = tuple[int, int, int, int, int, tuple[int, ...]]
StepCost = tuple[int, int, int, int, int, int, int]
# What a greedy search keeps: links into the set per GPU, NUMA nodes entered,
# each node's candidates, and how many candidates each node has.
_GrowState = tuple[
    dict[int, int], set[int | None], dict[int | None, list[int]], dict[int | None, int]
]


@dataclass(frozen=True, slots=True)
class Ranking:
    """What ranks one candidate set against another (see the module docstring).

    ``later`` holds the GPUs a reservation takes from the job after now;
    ``load`` counts other jobs per GPU; ``own`` is what the job holds now.
    """

    numa: Mapping[int, int | None]
    peers: Mapping[int, frozenset[int]]
    load: Mapping[int, int]
    own: frozenset[int]
    later: frozenset[int] = frozenset()

    @classmethod
    def build(
        cls,
        inventory: Sequence[GpuInfo] | None,
        load: Mapping[int, int],
        own: frozenset[int],
        later: frozenset[int] = frozenset(),
    ) -> Ranking:
        """The ranking facts of a host: NUMA nodes and NVLink peers from its inventory."""
        gpus = inventory or ()
        numa = {g.index: g.numa_node for g in gpus}
        if all(node is None for node in numa.values()):
            numa = {}  # no NUMA facts: every set spans "one" node
        peers: dict[int, set[int]] = {}
        for gpu in gpus:
            for peer in gpu.nvlink_peers:
                if peer != gpu.index:  # links are symmetric, whichever side reports them
                    peers.setdefault(gpu.index, set()).add(peer)
                    peers.setdefault(peer, set()).add(gpu.index)
        frozen = {gpu: frozenset(linked) for gpu, linked in peers.items()}
        return cls(numa=numa, peers=frozen, load=load, own=own, later=later)

    def score(self, chosen: tuple[int, ...]) -> Score:
        """Lower is better; the last element makes ties go to the lowest indices."""
        members = set(chosen)
        missing_links = 0
        if self.peers:
            inside = sum(len(self.peers.get(g, frozenset()) & members) for g in chosen) // 2
            missing_links = math.comb(len(chosen), 2) - inside
        numa_nodes = len({self.numa.get(g) for g in chosen}) if self.numa else 1
        return (
            sum(1 for g in chosen if g in self.later),
            missing_links,
            numa_nodes,
            sum(self.load.get(g, 0) for g in chosen),
            sum(1 for g in chosen if g not in self.own),
            chosen,
        )

    def choose(self, candidates: Sequence[int], count: int) -> tuple[int, ...]:
        """The best-scoring ``count`` GPUs among ``candidates`` (sorted ascending)."""
        ordered = tuple(sorted(candidates))
        if math.comb(len(ordered), count) <= EXHAUSTIVE_LIMIT:
            return min(itertools.combinations(ordered, count), key=self.score)
        return min(
            (self._grow(seed, ordered, count) for seed in self._seeds(ordered)), key=self.score
        )

    def _seeds(self, ordered: tuple[int, ...]) -> list[int]:
        """Where a greedy search starts: the lowest GPU, the job's own, each NUMA node's lowest."""
        firsts: dict[int | None, int] = {}
        for gpu in ordered:
            firsts.setdefault(self.numa.get(gpu), gpu)
        own = [g for g in ordered if g in self.own][:1]
        preferred = [g for g in ordered if g not in self.later][:1]
        seeds = {ordered[0], *own, *preferred, *list(firsts.values())[:MAX_SEEDS]}
        return sorted(seeds)

    def _grow(self, seed: int, ordered: tuple[int, ...], count: int) -> tuple[int, ...]:
        """Greedy: from ``seed``, add whichever GPU adds the least to the score."""
        chosen = {seed}
        links: dict[int, int] = {}
        nodes = {self.numa.get(seed)} if self.numa else set()
        members: dict[int | None, list[int]] = {}
        for gpu in ordered:
            members.setdefault(self.numa.get(gpu), []).append(gpu)
        room = {node: len(gpus) for node, gpus in members.items()}
        cost = {g: self._step_cost(g, links, nodes, room) for g in ordered if g != seed}
        heap = [(value, g) for g, value in cost.items()]
        heapq.heapify(heap)
        self._joined(seed, chosen, (links, nodes, members, room), cost, heap)
        while len(chosen) < count:
            value, gpu = heapq.heappop(heap)
            if gpu in chosen or cost[gpu] != value:
                continue  # a stale entry: the GPU's cost changed since it was pushed
            chosen.add(gpu)
            self._joined(gpu, chosen, (links, nodes, members, room), cost, heap)
        return tuple(sorted(chosen))

    def _joined(
        self,
        gpu: int,
        chosen: set[int],
        state: _GrowState,
        cost: dict[int, StepCost],
        heap: list[tuple[StepCost, int]],
    ) -> None:
        """Update the costs ``gpu`` joining the set changes: its peers', its NUMA node's."""
        links, nodes, members, room = state
        touched = [peer for peer in self.peers.get(gpu, ()) if peer in cost]
        for peer in touched:
            links[peer] = links.get(peer, 0) + 1
        node = self.numa.get(gpu)
        if self.numa and node not in nodes:
            nodes.add(node)
            touched.extend(members.get(node, ()))
        for other in touched:
            if other in chosen:
                continue
            cost[other] = self._step_cost(other, links, nodes, room)
            heapq.heappush(heap, (cost[other], other))

    def _step_cost(
        self,
        gpu: int,
        links: dict[int, int],
        nodes: set[int | None],
        room: dict[int | None, int],
    ) -> StepCost:
        """What adding ``gpu`` costs: the score's order, links counted as those it brings.

        Entering a new NUMA node, the one with the most candidates comes
        first, so a large request spans as few nodes as it can.
        """
        node = self.numa.get(gpu)
        new_node = bool(self.numa) and node not in nodes
        return (
            int(gpu in self.later),
            -links.get(gpu, 0),
            int(new_node),
            -room[node] if new_node else 0,
            self.load.get(gpu, 0),
            int(gpu not in self.own),
            gpu,
        )
