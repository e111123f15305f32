"""The second half of ``allocator demo``: a real agent on a fake 4-GPU host.

It starts ``allocator agent`` as a child process against a throw-away SQLite
store, with NVML faked by a JSON file the demo edits to break and repair a
GPU, and shows what the agent does with one job: start it on GPUs 1,3, move
it to GPU 2, fall back to CPU when GPU 2 fails and return when it recovers,
and stop it on release.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["run_agent_tour"]

HOST = "node1"
# What the demo job runs: it says what it was given, then sleeps until stopped.
WORKER = (
    "import os, time; e = os.environ; "
    'print(f\'worker pid {os.getpid()}: CUDA_VISIBLE_DEVICES={e["CUDA_VISIBLE_DEVICES"]!r} '
    'ALLOCATOR_DEVICE={e["ALLOCATOR_DEVICE"]} '
    'fallback={e.get("ALLOCATOR_FALLBACK_REASON", "-")!r}\', flush=True); time.sleep(3600)'
)


def _policy() -> dict[str, Any]:
    return {
        "version": 1,
        "visible_devices": "index",
        "hosts": {HOST: {"gpus": 4}},
        "jobs": {
            "train": {
                "command": [sys.executable, "-c", WORKER],
                "fallback": "cpu-4",
                "grace_seconds": 5,
            }
        },
        "fallback": {"cpu-4": {"action": "cpu", "threads": 4}},
        "health": {"interval_seconds": 1, "hold_down_seconds": 2},
    }


def _write_gpus(path: Path, broken: set[int]) -> None:
    # XID 79 is "GPU has fallen off the bus"; an XID is one event, so the GPU is
    # back in service after two clean health checks once it stops recurring.
    devices = [{"index": i, "xid_events": [79] if i in broken else []} for i in range(4)]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"devices": devices, "driver_version": "550.54.15"}))
    os.replace(tmp, path)


class _Tour:
    """Drives one agent and prints what an operator would see."""

    def __init__(self, workdir: Path, run_cli: Callable[[list[str]], int]) -> None:
        self.workdir = workdir
        self.store = f"sqlite://{workdir / 'agent-demo.db'}"
        self.gpus = workdir / "gpus.json"
        self.run_cli = run_cli
        self.log = workdir / "agent" / "logs" / "train.log"
        self.agent: subprocess.Popen[bytes] | None = None

    def cli(self, *words: str) -> None:
        """Run one CLI command against the tour's store, echoing it like a shell would."""
        print(f"$ allocator {' '.join(words)}", flush=True)
        code = self.run_cli([*words, "--store", self.store])
        if code != 0:
            raise RuntimeError(f"`allocator {' '.join(words)}` exited {code}")

    def start_agent(self) -> None:
        """Start ``allocator agent`` as a child, NVML faked by the tour's file."""
        env = {**os.environ, "ALLOCATOR_NVML": f"fake:{self.gpus}"}
        for name in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
            env.pop(name, None)
        print(f"$ ALLOCATOR_NVML=fake:{self.gpus.name} allocator agent --host {HOST} &", flush=True)
        with (self.workdir / "agent.log").open("wb") as log:
            self.agent = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "allocator",
                    "agent",
                    "--host",
                    HOST,
                    "--store",
                    self.store,
                    "--state-dir",
                    str(self.workdir / "agent"),
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop_agent(self) -> None:
        """SIGTERM the agent (it stops its workers) and wait for it."""
        if self.agent is not None and self.agent.poll() is None:
            self.agent.send_signal(signal.SIGTERM)
            try:
                self.agent.wait(30)
            except subprocess.TimeoutExpired:
                self.agent.kill()
                self.agent.wait(10)
        self.agent = None

    def worker_line(self, after: int, what: str) -> int:
        """Wait for the worker's next self-report in its log; print it; return its line count."""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            lines = _worker_lines(self.log)
            if len(lines) > after:
                print(f"  agent -> {lines[-1]}", flush=True)
                return len(lines)
            time.sleep(0.05)
        raise RuntimeError(
            f"the agent did not {what} within 20 s (see {self.workdir / 'agent.log'})"
        )

    def worker_stopped(self) -> None:
        """Wait until the last reported worker is gone; print it."""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if _no_train_process(self.log):
                print("  agent -> worker stopped", flush=True)
                return
            time.sleep(0.05)
        raise RuntimeError("the agent did not stop the worker within 20 s")


def _worker_lines(log: Path) -> list[str]:
    """The demo worker's self-reports (the agent also writes a header per start)."""
    text = log.read_text() if log.exists() else ""
    return [line for line in text.splitlines() if line.startswith("worker pid ")]


def _no_train_process(log: Path) -> bool:
    lines = _worker_lines(log)
    if not lines:
        return False
    pid = int(lines[-1].split()[2].rstrip(":"))
    return not Path(f"/proc/{pid}").exists()


def run_agent_tour(workdir: Path, run_cli: Callable[[list[str]], int]) -> None:
    """Run the agent part of the demo in ``workdir``; raise if a step does not happen."""
    tour = _Tour(workdir, run_cli)
    policy = workdir / "agent-policy.yaml"
    policy.write_text(json.dumps(_policy(), indent=2))
    _write_gpus(tour.gpus, broken=set())
    started = time.monotonic()
    try:
        tour.cli("policy", "apply", str(policy))
        tour.start_agent()
        tour.cli("set", "job=train", "gpus=1,3", f"host={HOST}")
        seen = tour.worker_line(0, "start the worker")
        tour.cli("set", "job=train", "gpus=2", f"host={HOST}")
        seen = tour.worker_line(seen, "move the worker")
        print("# GPU 2 fails (fake NVML reports XID 79)", flush=True)
        _write_gpus(tour.gpus, broken={2})
        seen = tour.worker_line(seen, "fall back to CPU")
        tour.cli("status", f"host={HOST}")
        print("# GPU 2 recovers", flush=True)
        _write_gpus(tour.gpus, broken=set())
        seen = tour.worker_line(seen, "return the worker to its GPU")
        tour.cli("status", f"host={HOST}")
        tour.cli("release", "job=train", f"host={HOST}", "reason=demo-done")
        tour.worker_stopped()
    finally:
        tour.stop_agent()  # it writes any decision still queued before it exits
    print(f"# agent tour done in {time.monotonic() - started:.1f} s\n", flush=True)
    print("# what happened, newest first: the operator's changes and the agent's decisions")
    tour.cli("history", f"host={HOST}")
