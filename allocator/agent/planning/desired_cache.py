"""The agent's desired jobs, as one part of the agent: recomputed only when their inputs change.

Also remembers which jobs a ``fail`` fallback rule marked failed, and at
which assignment revision: they stay failed until their assignment changes.
"""

from __future__ import annotations

from collections.abc import Mapping

from allocator.agent.planning.desired import desired_jobs
from allocator.agent.planning.desired_inputs import DesiredInputs
from allocator.agent.planning.port_table import PortTable
from allocator.agent.planning.types import DesiredJob

__all__ = ["DesiredCache"]


class DesiredCache:
    """The desired jobs, the inputs they were computed from, and the jobs marked failed."""

    def __init__(self, ports: PortTable, allowed_cpus: frozenset[int]) -> None:
        self.ports = ports  # the MASTER_PORT table (an input, saved in the state directory)
        self.allowed_cpus = allowed_cpus  # what workers may be pinned within
        self.desired: dict[str, DesiredJob] = {}
        self.failed: dict[str, int] = {}  # job -> the assignment revision it failed at
        self._inputs: DesiredInputs | None = None

    def update(self, inputs: DesiredInputs) -> dict[str, DesiredJob] | None:
        """Recompute if ``inputs`` differ from the last; return the jobs before (None: unchanged).

        The inputs are kept only once computed, so a computation that failed is tried again.
        """
        if inputs == self._inputs:
            return None
        before = self.desired
        self.desired = desired_jobs(inputs)
        self._inputs = inputs
        return before

    def note_failed(self, revisions: Mapping[str, int]) -> list[DesiredJob]:
        """Remember the jobs failed now, forget those whose assignment changed; return the new."""
        new = [
            want
            for job, want in self.desired.items()
            if want.state == "failed" and job not in self.failed
        ]
        for want in new:
            self.failed[want.job] = want.assignment_revision
        self.failed = {job: rev for job, rev in self.failed.items() if revisions.get(job) == rev}
        return new
