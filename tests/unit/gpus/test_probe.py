"""The deep probe: a spawned process with a hard timeout that leaves nothing behind."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from allocator.gpus.probe import (
    DEFAULT_PROBE_CODE,
    default_probe_command,
    probe_code,
    run_deep_probe,
)

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def process_gone(pid: int) -> bool:
    """No such process, or a zombie waiting for its (new) parent to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def wait_gone(pids: list[int], limit: float = 10.0) -> list[int]:
    """Poll until every pid is gone or ``limit`` passes; return those still alive."""
    deadline = time.monotonic() + limit
    alive = [pid for pid in pids if not process_gone(pid)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [pid for pid in alive if not process_gone(pid)]
    return alive


def read_pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()]


def test_hanging_probe_times_out_and_is_killed() -> None:
    result = run_deep_probe(ENV, 0.5, ["sleep", "60"])
    assert not result.ok and result.timed_out
    assert result.returncode == -9
    assert "did not finish within 0.5s" in result.reason
    assert wait_gone([result.pid]) == []


def test_timeout_kills_the_probes_children_too(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # The shell records its own pid and its sleeping child's, then waits.
    script = f'sleep 60 & echo "$$ $!" > {pids}; wait'
    result = run_deep_probe(ENV, 2.0, ["sh", "-c", script])
    assert not result.ok and result.timed_out
    recorded = read_pids(pids)
    assert recorded[0] == result.pid
    assert wait_gone(recorded) == []


def test_children_left_by_a_finished_probe_are_killed(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # Exits at once, leaving a sleeping child in its process group.
    script = f'sleep 60 & echo "$$ $!" > {pids}'
    result = run_deep_probe(ENV, 30.0, ["sh", "-c", script])
    assert result.ok and not result.timed_out and result.returncode == 0
    assert wait_gone(read_pids(pids)) == []


def test_probe_runs_in_its_own_session() -> None:
    code = "import os; print(os.getsid(0) == os.getpid())"
    result = run_deep_probe(ENV, 30.0, [sys.executable, "-c", code])
    assert result.ok and result.output.strip() == "True"


def test_probe_gets_exactly_the_given_environment() -> None:
    env = {**ENV, "CUDA_VISIBLE_DEVICES": "GPU-abc", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    code = "import os, json; print(json.dumps(sorted(os.environ.items())))"
    result = run_deep_probe(env, 30.0, [sys.executable, "-c", code])
    assert result.ok
    seen = dict(json.loads(result.output))
    assert seen["CUDA_VISIBLE_DEVICES"] == "GPU-abc"
    assert "ALLOCATOR_NVML" not in seen and "HOME" not in seen


def test_failing_probe_reports_its_last_line() -> None:
    code = "import sys; print('context failed', file=sys.stderr); sys.exit(3)"
    result = run_deep_probe(ENV, 30.0, [sys.executable, "-c", code])
    assert not result.ok and not result.timed_out
    assert result.returncode == 3
    assert result.reason == "probe failed with exit status 3: context failed"


def test_probe_killed_by_a_signal_says_which() -> None:
    result = run_deep_probe(ENV, 30.0, ["sh", "-c", "kill -SEGV $$"])
    assert not result.ok and result.returncode == -11
    assert "SIGSEGV" in result.reason


def test_unstartable_probe_is_a_failure_not_an_exception(tmp_path: Path) -> None:
    result = run_deep_probe(ENV, 5.0, [str(tmp_path / "no-such-probe")])
    assert not result.ok and "cannot start probe" in result.reason


def test_default_probe_creates_a_cuda_context_in_a_fresh_python() -> None:
    assert default_probe_command() == [sys.executable, "-c", DEFAULT_PROBE_CODE]
    assert "torch.zeros(1, device='cuda')" in DEFAULT_PROBE_CODE
    assert "torch.cuda.synchronize()" in DEFAULT_PROBE_CODE


def test_each_device_type_gets_a_probe_of_its_own() -> None:
    for kind in ("cuda", "xpu", "mps"):
        assert default_probe_command(kind) == [sys.executable, "-c", probe_code(kind)]
        assert f"device='{kind}'" in probe_code(kind)
        assert f"torch.{kind}.synchronize()" in probe_code(kind)
    assert probe_code("cpu") == DEFAULT_PROBE_CODE  # nothing a CPU worker can pass
