"""The warm shim: an idle shim started ahead of time and handed the next worker.

Real processes throughout: the idle shim is ``python -I -S shim/main.py --idle``,
the worker is the dummy worker, which reports its environment.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from allocator.agent.processes.launch import SHIM, shim_env, start_under_shim
from allocator.agent.processes.warm_shim import IdleShim, WarmShims
from allocator.agent.processes.worker_status import read_shim_status
from allocator.agent.shim.main import decode_handover, encode_handover, unframe
from tests.support.supervision import DUMMY, alive, kill_reported, poll, read_json

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux")

SECRET = "ALLOCATOR_TEST_AGENT_SECRET"


@pytest.fixture
def warm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[WarmShims]:
    """Warm shims of an agent whose own environment holds a secret."""
    monkeypatch.setenv(SECRET, "s3cret")
    shims = WarmShims(SHIM, tmp_path, shim_env)
    try:
        yield shims
    finally:
        shims.close()
        kill_reported(tmp_path)


def _ready(shims: WarmShims) -> IdleShim:
    shims.tick()
    assert shims.idle is not None
    return shims.idle


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(entry.split("=", 1) for entry in raw.decode().split("\0") if "=" in entry)


_STARTED: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def _reap_shims() -> Iterator[None]:
    """Every shim a test started ends with it (its whole session), and is reaped."""
    try:
        yield
    finally:
        while _STARTED:
            shim = _STARTED.pop()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shim.pid, signal.SIGKILL)
            shim.wait(30)


def _start(tmp: Path, idle: IdleShim | None, env: dict[str, str], name: str = "w") -> int:
    out = tmp / "reports" / f"{name}.json"
    launch = start_under_shim(
        [sys.executable, DUMMY, "--out", str(out)],
        env,
        cwd=None,
        log_path=tmp / f"{name}.log",
        header=f"--- {name} ---",
        status_path=tmp / f"{name}.status",
        grace=5.0,
        cgroup=None,
        run_as=None,
        warm=idle,
    )
    assert launch.pid > 0 and launch.popen is not None, launch.error
    _STARTED.append(launch.popen)
    return launch.pid


def test_a_worker_handed_to_a_warm_shim_has_exactly_its_environment(
    tmp_path: Path, warm: WarmShims
) -> None:
    idle = _ready(warm)
    assert SECRET not in _environ(idle.pid)  # the idle shim holds none of the agent's secrets
    env = {
        "PATH": os.environ["PATH"],
        "LANG": "C.UTF-8",  # not the C locale, which the worker's Python would coerce
        "JOB_VARIABLE": "a b=c",
        "CUDA_VISIBLE_DEVICES": "3",
    }
    shim = _start(tmp_path, warm.take(), env)
    assert shim == idle.pid  # the warm shim ran it: no new shim was started
    report = poll(lambda: read_json(tmp_path / "reports" / "w.json"), "the worker's report")
    assert report["env"] == env
    status = poll(lambda: read_shim_status(tmp_path / "w.status"), "the status file")
    assert (status.shim_pid, status.pid) == (idle.pid, report["pid"])
    assert "--- w ---" in (tmp_path / "w.log").read_text()  # the log came with the hand-over


def test_a_stopped_warm_worker_ends_whole_with_its_exit_status(
    tmp_path: Path, warm: WarmShims
) -> None:
    idle = _ready(warm)
    _start(tmp_path, warm.take(), {"PATH": os.environ["PATH"]})
    worker = poll(lambda: read_json(tmp_path / "reports" / "w.json"), "the report")["pid"]
    os.kill(idle.pid, signal.SIGTERM)
    assert idle.popen.wait(30) == 128 + signal.SIGTERM
    assert not alive(worker)
    status = read_shim_status(tmp_path / "w.status")
    assert status is not None and (status.state, status.exit_code) == ("exited", 143)


def test_an_idle_shim_ends_when_its_agent_closes_it(warm: WarmShims) -> None:
    idle = _ready(warm)
    warm.close()
    assert idle.popen.wait(30) == 0
    warm.tick()
    assert warm.idle is None  # closed: none started again


def test_an_idle_shim_ends_when_its_agents_end_of_the_socket_goes(warm: WarmShims) -> None:
    idle = _ready(warm)
    idle.sock.close()  # what the kernel does for an agent killed with SIGKILL
    assert idle.popen.wait(30) == 0


def test_a_warm_shim_that_died_is_replaced(tmp_path: Path, warm: WarmShims) -> None:
    dead = _ready(warm)
    dead.popen.kill()
    dead.popen.wait(30)
    warm.tick()
    assert warm.idle is not None and warm.idle.pid != dead.pid
    assert alive(warm.idle.pid)


def test_a_worker_whose_warm_shim_died_starts_under_a_cold_one(
    tmp_path: Path, warm: WarmShims
) -> None:
    idle = _ready(warm)
    idle.popen.kill()
    idle.popen.wait(30)
    assert warm.take() is None  # found dead when wanted
    assert warm.died == 1
    shim = _start(tmp_path, None, {"PATH": os.environ["PATH"]})
    assert shim != idle.pid
    poll(lambda: read_json(tmp_path / "reports" / "w.json"), "the worker's report")


def test_a_hand_over_to_a_shim_that_is_gone_fails_so_the_caller_starts_cold(
    warm: WarmShims,
) -> None:
    idle = _ready(warm)
    idle.popen.kill()
    idle.popen.wait(30)
    read, write = os.pipe()
    try:
        assert not idle.hand_over(["x"], b"", write)
    finally:
        os.close(read)
        os.close(write)


@pytest.mark.parametrize(
    ("args", "payload"),
    [([], b""), (["", "a\nb", "--", "x y"], b"K=V\0L=W\0\0cpus=0-3"), (["é"], b"A=\xc3\xa9")],
)
def test_a_hand_over_frame_round_trips(args: list[str], payload: bytes) -> None:
    framed = encode_handover(args, payload)
    assert int.from_bytes(framed[:8], "big") < len(framed) - 8  # the end marker follows
    assert decode_handover(unframe(framed)) == (args, payload)
    with pytest.raises(ValueError, match="incomplete hand-over"):
        unframe(framed[:-1])
