"""Run a real agent process against a real store, with a fake-NVML host of 4 GPUs.

The workers are ``tests/support/dummy_worker.py`` processes that write a
report (PID, process group, environment) to a file per job and hold an
exclusive lock on a per-job lock file, recording whether they got it at
once: a worker that started while its predecessor still ran would not.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from allocator.agent.processes.launch import SHIM
from allocator.records.keys import KeyLayout
from allocator.records.types import WorkerRecord
from allocator.store import open_store
from tests.e2e.conftest import Result, run_cli
from tests.support.fake_gpus import FakeGpus
from tests.support.waiting import wait_for

DUMMY = Path(__file__).resolve().parents[1] / "support" / "dummy_worker.py"
HOST = "node1"


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone before the open or during the read
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def reap_like_init(pids: list[int]) -> None:
    """Orphans of a dead agent are reaped by init (or this process, if it is their subreaper)."""

    def reaped() -> bool:
        for pid in list(pids):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # init's to reap, not ours: done once not even a zombie
                done = pid if not Path(f"/proc/{pid}").exists() else 0
            if done:
                pids.remove(pid)
        return not pids

    wait_for("the dead agent's orphans to be reaped", reaped)


def _job(name: str, workdir: Path, *extra: str, **fields: Any) -> dict[str, Any]:
    out = workdir / f"{name}.json"
    command = [
        sys.executable,
        str(DUMMY),
        "--out",
        str(out),
        "--lock",
        str(workdir / f"{name}.lock"),
    ]
    return {"command": [*command, *extra], "grace_seconds": 1, **fields}


def agent_policy(workdir: Path, gpus: int = 4) -> dict[str, Any]:
    """A policy with one host of ``gpus`` GPUs and the jobs the tests run."""
    return {
        "version": 1,
        "visible_devices": "uuid",
        "hosts": {HOST: {"gpus": gpus}},
        "jobs": {
            "train": _job("train", workdir, fallback="cpu-2"),
            "waiter": _job("waiter", workdir, fallback="wait"),
            "stubborn": _job("stubborn", workdir, "--ignore-sigterm", "--spawn-child"),
            "crashy": _job(
                "crashy",
                workdir,
                "--crash",
                max_restarts=2,
                restart_backoff_seconds=0.1,
                restart_backoff_max_seconds=0.2,
            ),
            "ranks": _job("ranks", workdir, workers="per-gpu"),
        },
        "fallback": {"cpu-2": {"action": "cpu", "threads": 2}, "wait": {"action": "wait"}},
        # A short hold-down: a recovered GPU returns half a second after its last failure.
        "health": {"interval_seconds": 0.2, "hold_down_seconds": 0.5},
    }


class AgentHarness:
    """One test's world: store, policy, fake GPUs, and the agent process."""

    def __init__(
        self, workdir: Path, store_url: str, prefix: str, gpus: int = 4, host: str = HOST
    ) -> None:
        self.workdir = workdir
        self.host = host
        self.store_url = store_url
        self.prefix = prefix
        self.gpus = FakeGpus(workdir / "gpus.json", gpus)
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("ALLOCATOR_", "CUDA_", "NVIDIA_"))
        }
        self.env.update(
            ALLOCATOR_STORE=store_url,
            ALLOCATOR_PREFIX=prefix,
            ALLOCATOR_NVML=f"fake:{self.gpus.path}",
            ALLOCATOR_HOST=host,  # this machine is the agent's host: `run` takes its GPUs
        )
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "agent.log"
        self.layout = KeyLayout(prefix)

    # --- set-up ---------------------------------------------------------------

    def apply_policy(self, policy: dict[str, Any] | None = None) -> None:
        """Write and apply the policy (the default: :func:`agent_policy`)."""
        path = self.workdir / "policy.yaml"
        path.write_text(json.dumps(policy or agent_policy(self.workdir)))  # JSON is YAML
        result = self.cli("policy", "apply", str(path))
        assert result.code == 0, result.err

    def start_agent(
        self,
        *extra: str,
        env: dict[str, str] | None = None,
        launcher: Sequence[str] = ("-m", "allocator"),
        wait: bool = True,
    ) -> None:
        """Start ``allocator agent`` for the host; its log goes to agent.log.

        ``env`` adds variables; ``launcher`` replaces ``-m allocator`` (a
        script that wraps the CLI); ``wait=False`` returns at once instead of
        waiting for the agent's record (for a store that does not answer).
        """
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    *launcher,
                    "agent",
                    "--host",
                    self.host,
                    "--state-dir",
                    str(self.workdir / "agent"),
                    "--log-format",
                    "json",
                    *extra,
                ],
                env={**self.env, **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if wait:
            wait_for("the agent to publish its record", self.agent_record_present)

    def stop_agent(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Signal the agent and wait for it to exit; return its exit code."""
        assert self.process is not None
        self.process.send_signal(sig)
        code = self.process.wait(timeout)
        self.process = None
        return code

    @contextmanager
    def running(
        self, *agent_args: str, start: bool = True, policy: dict[str, Any] | None = None
    ) -> Iterator[AgentHarness]:
        """``policy`` applied (:func:`agent_policy`'s by default), the agent started (unless
        ``start`` is False); cleaned up after."""
        try:
            self.apply_policy(policy)
            if start:
                self.start_agent(*agent_args)
            yield self
        finally:
            self.cleanup()

    def cleanup(self) -> None:
        """Stop the agent and kill anything a failed test left running."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        # Every worker's (and shim's) command line names a file in this test's directory.
        kill_left(str(self.workdir))

    # --- observing ----------------------------------------------------------------

    def cli(self, *args: str) -> Result:
        """Run the allocator CLI against this world's store."""
        return run_cli(args, self.env)

    def report(self, job: str) -> dict[str, Any] | None:
        """The latest report of ``job``'s (single) worker, if any."""
        try:
            data: dict[str, Any] = json.loads((self.workdir / f"{job}.json").read_text())
        except (FileNotFoundError, ValueError):
            return None
        return data

    def new_report(
        self, job: str, not_pid: int | None = None, timeout: float = 15.0
    ) -> dict[str, Any]:
        """Wait for a report of ``job`` from a live worker other than ``not_pid``."""

        def fresh() -> dict[str, Any] | None:
            report = self.report(job)
            if report and report["pid"] != not_pid and pid_alive(report["pid"]):
                return report
            return None

        return wait_for(f"a new worker of {job}", fresh, timeout)

    def worker_record(self, job: str) -> WorkerRecord | None:
        """What the agent reports it runs for ``job``."""
        store = open_store(self.store_url)
        try:
            item = store.get(self.layout.workers(self.host, job))
        finally:
            store.close()
        return WorkerRecord.from_json(item.value) if item else None

    def put_raw(self, key: str, value: bytes) -> int:
        """Write ``value`` at ``key`` (a full key) straight into the store; return the revision."""
        store = open_store(self.store_url)
        try:
            return store.put(key, value)
        finally:
            store.close()

    def agent_record_present(self) -> bool:
        """Whether the agent's leased record exists."""
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"the agent exited early:\n{self.log_text()}")
        store = open_store(self.store_url)
        try:
            return store.get(self.layout.agent(self.host)) is not None
        finally:
            store.close()

    def log_events(self) -> list[dict[str, Any]]:
        """The agent's decision log, parsed."""
        events = []
        for line in self.log_text().splitlines():
            with suppress(ValueError):
                events.append(json.loads(line))
        return events

    def events(self, name: str, **match: object) -> list[dict[str, Any]]:
        """The agent's log events called ``name`` whose fields equal ``match``."""
        return [
            e
            for e in self.log_events()
            if e["event"] == name and all(e.get(k) == v for k, v in match.items())
        ]

    def log_text(self) -> str:
        """The agent's raw log."""
        return self.log_path.read_text() if self.log_path.exists() else ""


def processes_running(marker: str, *, shims: bool = False) -> Iterator[int]:
    """PIDs of live processes whose command line contains ``marker`` (workers' shims aside)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if not shims and str(SHIM) in cmdline:
                continue
            if marker in cmdline and pid_alive(int(entry.name)):
                yield int(entry.name)


def kill_left(marker: str) -> None:
    """SIGKILL every process (shims too) whose command line contains ``marker``."""
    for pid in processes_running(marker, shims=True):
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@contextmanager
def hosts_of(
    tmp: Path, store_url: str, prefix: str, names: Sequence[str], gpus: int = 2
) -> Iterator[dict[str, AgentHarness]]:
    """A harness per host of ``names`` (``gpus`` fake GPUs each), in ``tmp/NAME``.

    After the block every agent is stopped and any process left whose command
    line names ``tmp`` is killed. The agents are the caller's to start.
    """
    agents: dict[str, AgentHarness] = {}
    try:
        for name in names:
            (tmp / name).mkdir()
            agents[name] = AgentHarness(tmp / name, store_url, prefix, gpus=gpus, host=name)
        yield agents
    finally:
        for agent in agents.values():
            agent.cleanup()
        kill_left(str(tmp))
