"""The supervisor's book of jobs: which jobs it tracks, their moves, and the state file.

Both the :class:`~allocator.agent.processes.supervisor.Supervisor` (starts,
changes, adoption) and the :class:`~allocator.agent.processes.reaping.Reaper`
(stops, SIGKILL, reaped exits) change jobs; each holds this one book, so
every move goes through the one transition table and every change is saved
by the one writer of the state file.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from allocator.agent.planning.job_phase import JobEvent
from allocator.agent.processes.job_state import JobRuntime
from allocator.agent.processes.state_file import StateFileError, read_state_file, write_state_file
from allocator.util.times import format_time

__all__ = ["JobBook", "Logger", "log_to_logging"]

Logger = Callable[[str, dict[str, Any]], None]


def log_to_logging(event: str, fields: dict[str, Any]) -> None:
    """The default logger: the standard ``allocator.agent`` logger."""
    logging.getLogger("allocator.agent").info("%s %s", event, fields)


class JobBook:
    """The tracked jobs, their moves by the transition table, and their state file."""

    def __init__(
        self, state_file: Path, boot_id: str, *, wall: Callable[[], datetime], log: Logger
    ) -> None:
        self.state_file = state_file
        self.boot_id = boot_id
        self.jobs: dict[str, JobRuntime] = {}
        self.dirty = False  # something changed that the state file does not say yet
        self._wall = wall
        self._log = log
        self._save_error = ""  # why the last save failed ("": it did not)

    def move(self, job: JobRuntime, event: JobEvent) -> bool:
        """Move ``job`` by the transition table; a refused move is a bug: logged, not raised."""
        before = job.phase
        if job.move(event):
            return True
        fields = {"job": job.spec.job, "phase": before.value, "event": event.value}
        self._log("illegal-transition", fields)
        return False

    def settle(self) -> None:
        """Finish stops whose groups are all gone, refresh states, save if anything changed."""
        stamp = format_time(self._wall())
        for job in self.jobs.values():
            if job.phase.stopping and job.alive() == 0:
                # STOPPED (its workers went because we said so), or back to CRASHED.
                self.move(job, JobEvent.STOP_DONE)
                job.stop_deadline = None
                self.dirty = True
                self._log("stopped", {"job": job.spec.job, "reason": job.stop_reason})
            if job.refresh_state(stamp):
                self.dirty = True
        if self.dirty:
            self.save()

    def save(self) -> str:
        """Rewrite the state file; "" if done, else why not (logged)."""
        try:
            write_state_file(self.state_file, self.jobs, self.boot_id)
        except OSError as exc:
            if str(exc) != self._save_error:  # once per cause: a full disk retries every tick
                self._log("state-write-failed", {"path": str(self.state_file), "error": str(exc)})
            self._save_error = str(exc)
            return f"cannot save the agent's state file {self.state_file}: {exc.strerror or exc}"
        if self._save_error:
            self._log("state-write-recovered", {"path": str(self.state_file)})
        self.dirty, self._save_error = False, ""
        return ""

    def load(self) -> dict[str, Any]:
        """The state file's jobs; {} when it cannot be used (the status files then say)."""
        try:
            return read_state_file(self.state_file, self.boot_id)
        except StateFileError as exc:
            fields = {"path": str(self.state_file), "error": str(exc), "adopting": "status files"}
            self._log("state-unreadable", fields)
            return {}
