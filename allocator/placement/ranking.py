"""Choosing ``count=N`` GPUs among the free ones: which set is best, in time linear in the host.

Sets are ranked by, in order: GPUs a reservation will take from the job
later; in a shared pool, the slots other jobs hold on them (free capacity
before links: a free pair before half of a busy NVLink pair, unless the
request says ``prefer=links``); then links: every pair NVLinked, then the
fewest NUMA nodes, PCIe host bridges, switch trees, switches and boards
spanned (so all NVLink > same switch > same host bridge > same NUMA node >
across sockets), then NVLink pairs missing; GPUs the job does not already
hold (so re-running the same request does not move, and restart, the job);
and finally the lowest indices.

Small choices are exhaustive (every combination scored). Large ones grow a
set greedily from a few seeds; each step takes the GPU that adds least,
from a heap whose entries are updated only for the GPUs a step affects (its
NVLink peers, and the GPUs of a group the set first enters), so a 1,024-GPU
host costs O(n log n) per seed, not a rescan per added GPU.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from allocator.gpus.topology import Links
from allocator.records.gpu_info import GpuInfo

__all__ = ["EXHAUSTIVE_LIMIT", "MAX_SEEDS", "Prefer", "Ranking"]

#: Above this many candidate sets, ``count=N`` uses a greedy search instead of
#: scoring every combination (real hosts have at most 16 GPUs: C(16, 8) = 12870).
EXHAUSTIVE_LIMIT = 20_000
#: Greedy searches started (lowest GPU, the job's own, one per NUMA node up to this).
MAX_SEEDS = 16

#: What a shared pool's ``count=N`` weighs first: free capacity, or links.
Prefer = Literal["free", "links"]
Score = tuple[Any, ...]
StepCost = tuple[int, ...]


@dataclass(slots=True)
class _Growth:
    """A greedy search's state: links into the set per GPU, groups entered per level."""

    links: dict[int, int]
    entered: list[set[Hashable]]
    cost: dict[int, StepCost]
    heap: list[tuple[StepCost, int]]


@dataclass(frozen=True, slots=True)
class Ranking:
    """What ranks one candidate set against another (see the module docstring).

    ``later`` holds the GPUs a reservation takes from the job after now;
    ``load`` counts slots other jobs hold per GPU; ``own`` is what the job
    holds now.
    """

    links: Links
    load: Mapping[int, int]
    own: frozenset[int]
    later: frozenset[int] = frozenset()
    prefer: Prefer = "free"

    @classmethod
    def build(
        cls,
        inventory: Sequence[GpuInfo] | None,
        load: Mapping[int, int],
        own: frozenset[int],
        later: frozenset[int] = frozenset(),
        prefer: Prefer = "free",
    ) -> Ranking:
        """The ranking facts of a host: its links from the inventory, and the jobs on it."""
        return cls(Links.of(inventory), load, own, later, prefer)

    def score(self, chosen: tuple[int, ...]) -> Score:
        """Lower is better; the last element makes ties go to the lowest indices."""
        missing = math.comb(len(chosen), 2) - self.links.nvlink_pairs(chosen)
        link_rank = (int(missing > 0), *self.links.spans(chosen), missing)
        load = sum(self.load.get(g, 0) for g in chosen)
        weighed = (load, *link_rank) if self.prefer == "free" else (*link_rank, load)
        return (
            sum(1 for g in chosen if g in self.later),
            *weighed,
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

    def explain(self, chosen: Sequence[int]) -> str:
        """Why these GPUs, in a few words: ``NVLink pair``, ``same PCIe switch; 2 free slots``."""
        parts = [self.links.describe(chosen)]
        if self.load:  # a shared pool with other jobs on it
            taken = sum(self.load.get(g, 0) for g in chosen)
            parts.append("no other job on them" if taken == 0 else f"{taken} slot(s) shared")
        if self.own and set(chosen) <= self.own:
            parts.append("the job's current GPUs")
        if any(g in self.later for g in chosen):
            parts.append("reserved for others later")
        said = "; ".join(part for part in parts if part)
        return said or "lowest free index"

    def _seeds(self, ordered: tuple[int, ...]) -> list[int]:
        """Where a greedy search starts: the lowest GPU, the job's own, each group's lowest.

        Groups are taken coarsest level first (NUMA nodes, then host bridges, ...),
        up to :data:`MAX_SEEDS` of them.
        """
        firsts: dict[tuple[int, Hashable], int] = {}
        for level in range(len(self.links.groups)):
            labels = self._labels(level)
            for gpu in ordered:
                firsts.setdefault((level, labels.get(gpu)), gpu)
        own = [g for g in ordered if g in self.own][:1]
        preferred = [g for g in ordered if g not in self.later][:1]
        groups = list(dict.fromkeys(firsts.values()))[:MAX_SEEDS]
        return sorted({ordered[0], *own, *preferred, *groups})

    def _labels(self, level: int) -> Mapping[int, Hashable]:
        groups = self.links.groups
        return groups[level][1] if level < len(groups) else {}

    def _grow(self, seed: int, ordered: tuple[int, ...], count: int) -> tuple[int, ...]:
        """Greedy: from ``seed``, add whichever GPU adds the least to the score."""
        levels = range(len(self.links.groups))
        members: list[dict[Hashable, list[int]]] = [{} for _ in levels]
        for level in levels:
            labels = self._labels(level)
            for gpu in ordered:
                members[level].setdefault(labels.get(gpu), []).append(gpu)
        room = {label: len(gpus) for label, gpus in members[0].items()} if members else {}
        state = _Growth({}, [set() for _ in levels], {}, [])
        state.cost = {g: self._step_cost(g, state, room) for g in ordered if g != seed}
        state.heap = [(value, g) for g, value in state.cost.items()]
        heapq.heapify(state.heap)
        chosen = {seed}
        self._joined(seed, chosen, state, members, room)
        while len(chosen) < count:
            value, gpu = heapq.heappop(state.heap)
            if gpu in chosen or state.cost[gpu] != value:
                continue  # a stale entry: the GPU's cost changed since it was pushed
            chosen.add(gpu)
            self._joined(gpu, chosen, state, members, room)
        return tuple(sorted(chosen))

    def _joined(
        self,
        gpu: int,
        chosen: set[int],
        state: _Growth,
        members: list[dict[Hashable, list[int]]],
        room: Mapping[Hashable, int],
    ) -> None:
        """Update the costs ``gpu`` joining the set changes: its peers', its new groups'."""
        touched = [peer for peer in self.links.peers.get(gpu, ()) if peer in state.cost]
        for peer in touched:
            state.links[peer] = state.links.get(peer, 0) + 1
        for level, entered in enumerate(state.entered):
            label = self._labels(level).get(gpu)
            if label not in entered:
                entered.add(label)
                touched.extend(members[level].get(label, ()))
        for other in touched:
            if other in chosen:
                continue
            state.cost[other] = self._step_cost(other, state, room)
            heapq.heappush(state.heap, (state.cost[other], other))

    def _step_cost(self, gpu: int, state: _Growth, room: Mapping[Hashable, int]) -> StepCost:
        """What adding ``gpu`` costs: the score's order, links counted as those it brings.

        Entering a new NUMA node, the one with the most candidates comes
        first, so a large request spans as few nodes as it can.
        """
        new = [
            int(self._labels(n).get(gpu) not in entered) for n, entered in enumerate(state.entered)
        ]
        node_room = -room.get(self._labels(0).get(gpu), 0) if new and new[0] else 0
        load = self.load.get(gpu, 0)
        links = (-state.links.get(gpu, 0), *new, node_room)
        weighed = (load, *links) if self.prefer == "free" else (*links, load)
        return (int(gpu in self.later), *weighed, int(gpu not in self.own), gpu)
