"""A worker the agent cannot record is a worker it does not start.

A full disk under the state directory is ordinary on a training host (the
logs live beside it by default). Before any fork the supervisor saves its
state file and writes each worker's first status file; if either fails,
nothing is launched: the job waits (``waiting``, the reason in its record)
and the start is tried again later. The full disk here is a real one: a
small tmpfs mounted for the test and filled (root only; the second test
needs no root: a write that fails because a directory stands where the
state file's temporary file goes).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from allocator.agent.planning.reconcile import plan
from allocator.agent.planning.types import Start
from allocator.agent.processes.supervisor import RECORD_RETRY_SECONDS, Supervisor
from tests.support.clock import FakeClock
from tests.support.full_disk import fill, small_tmpfs
from tests.support.supervision import AGENT_ENV, job_spec, kill_reported, poll, processes_running

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux")


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A directory on a small tmpfs, filled to the last byte (skipped where mounting is refused)."""
    mount = tmp_path / "state"
    with small_tmpfs(mount, "256k") as why_not:
        if why_not:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {why_not}")
        yield mount


class World:
    """A supervisor whose state lives in ``state_dir``, its events, and a fake clock."""

    def __init__(self, tmp: Path, state_dir: Path) -> None:
        self.tmp = tmp
        self.clock = FakeClock()
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.sup = Supervisor(
            tmp / "logs",
            state_dir / "workers.json",
            base_env=AGENT_ENV,
            clock=self.clock,
            logger=lambda name, fields: self.events.append((name, dict(fields))),
            cgroups=False,
            warm_shim=False,
        )

    def names(self) -> list[str]:
        return [name for name, _ in self.events]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[Callable[[Path], World]]:
    made: list[World] = []

    def build(state_dir: Path) -> World:
        made.append(World(tmp_path, state_dir))
        return made[-1]

    try:
        yield build
    finally:
        for one in made:
            one.sup.stop_all(grace=0)
        kill_reported(tmp_path)


def _held_then_started(w: World, free: Callable[[], None]) -> None:
    """The start is held while nothing can be recorded, and made once room is back."""
    spec = job_spec(w.tmp)
    w.sup.apply(Start("train", spec, "new"))
    w.sup.tick()
    assert "worker-started" not in w.names()
    assert "start-held" in w.names()
    record = w.sup.records()["train"]
    assert record["state"] == "waiting"
    assert "not started" in record["message"]
    assert w.sup.views()["train"].alive == 0
    assert processes_running(w.tmp / "reports" / "train.0.json") == []
    # Nothing is retried before its time, and nothing counts as a crash or a restart.
    assert plan({"train": spec}, w.sup.views(), w.clock()) == []
    assert (record["restarts"], record["crash_restarts"]) == (0, 0)
    for _ in range(3):  # every tick retries the save; the log says it once
        w.sup.tick()
    assert w.names().count("state-write-failed") == 1
    free()
    w.clock.advance(RECORD_RETRY_SECONDS)
    actions = plan({"train": spec}, w.sup.views(), w.clock())
    assert [(type(a), a.job) for a in actions] == [(Start, "train")]
    for action in actions:
        w.sup.apply(action)
    report = poll(lambda: _read(w.tmp / "reports" / "train.0.json"), "the worker's report")
    assert processes_running(w.tmp / "reports" / "train.0.json") == [report["pid"]]
    assert w.sup.records()["train"]["state"] == "running"
    assert "state-write-recovered" in w.names()


def _read(path: Path) -> dict[str, Any] | None:
    import json

    with contextlib.suppress(FileNotFoundError, ValueError):
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    return None


def test_a_full_disk_under_the_state_directory_starts_nothing_until_there_is_room(
    full_disk: Path, world: Callable[[Path], World]
) -> None:
    w = world(full_disk)
    filler = fill(full_disk)
    _held_then_started(w, filler.unlink)
    held = [f for name, f in w.events if name == "start-held"]
    assert "No space left on device" in held[0]["reason"]


def test_a_state_file_that_cannot_be_written_starts_nothing(
    tmp_path: Path, world: Callable[[Path], World]
) -> None:
    """Without root: a directory where the state file's temporary file must go."""
    state_dir = tmp_path / "state"
    w = world(state_dir)
    blocker = state_dir / f".workers.json.{os.getpid()}.tmp"
    blocker.mkdir(parents=True)
    _held_then_started(w, blocker.rmdir)
    held = [f for name, f in w.events if name == "start-held"]
    assert "cannot save the agent's state file" in held[0]["reason"]
