"""The deep probe: create a device context in a separate process, with a hard timeout.

The probe creates one tensor on the worker's PyTorch device type and waits
for it (:func:`probe_code`): ``cuda`` on NVIDIA and on AMD (PyTorch's ROCm
build drives HIP devices as ``cuda``), ``xpu`` on Intel, ``mps`` on Apple
silicon. ``torch.zeros(1, device="cuda")`` costs a CUDA context (hundreds of MB) and
can hang forever on a bad GPU, so it never runs in the caller's process: it
runs in a freshly executed Python in its own session
(``start_new_session=True``), and when the timeout expires the whole
process group is killed with SIGKILL and reaped. A timeout is a failure.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import IO

__all__ = [
    "DEFAULT_PROBE_CODE",
    "ProbeResult",
    "default_probe_command",
    "probe_code",
    "run_deep_probe",
]

DEFAULT_PROBE_CODE = "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()"
# Each device type's module has its own synchronize(); a tensor on the
# device is what makes the runtime open it.
_PROBE_CODE = {
    "cuda": DEFAULT_PROBE_CODE,
    "xpu": "import torch; torch.zeros(1, device='xpu'); torch.xpu.synchronize()",
    "mps": "import torch; torch.zeros(1, device='mps'); torch.mps.synchronize()",
}

# After SIGKILL a process stuck in the driver (uninterruptible sleep) may
# not die at once; wait this long for it before reporting it as stuck.
_KILL_GRACE_SECONDS = 5.0
_OUTPUT_LIMIT = 4000


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """How the probe went. ``ok`` only for exit status 0 within the timeout."""

    ok: bool
    reason: str
    returncode: int | None
    timed_out: bool
    output: str
    pid: int


def probe_code(device_type: str = "cuda") -> str:
    """The Python that opens a ``device_type`` device and waits for it.

    ``cpu`` (and any type without a GPU runtime) gets the CUDA probe: a
    worker with no GPU visible has nothing that can pass it.
    """
    return _PROBE_CODE.get(device_type, DEFAULT_PROBE_CODE)


def default_probe_command(device_type: str = "cuda") -> list[str]:
    """The probe run when no command is given: this Python, opening a ``device_type`` device."""
    return [sys.executable, "-c", probe_code(device_type)]


def run_deep_probe(
    env: Mapping[str, str],
    timeout: float,
    command: Sequence[str] | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> ProbeResult:
    """Run the probe with exactly ``env`` as its environment; wait at most ``timeout`` s.

    ``env`` is the probe's whole environment (the worker's, with its
    ``CUDA_VISIBLE_DEVICES``). On expiry the probe's process group is
    SIGKILLed, so helpers it started die with it.
    """
    argv = list(command) if command is not None else default_probe_command()
    with tempfile.TemporaryFile() as out:
        # Output goes to a file, not a pipe: a leftover grandchild holding a
        # pipe open could block reading it forever.
        try:
            proc = subprocess.Popen(
                argv,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            return ProbeResult(False, f"cannot start probe: {exc}", None, False, "", 0)
        exited = _wait_unreaped(proc.pid, clock() + timeout, clock, sleep)
        # Kill the group while the leader is still unreaped, so its pid
        # (= the group id) cannot have been reused by an unrelated process.
        _kill_group(proc.pid)
        returncode = _reap(proc, clock() + _KILL_GRACE_SECONDS, clock, sleep)
        output = _tail(out)
    return _result(proc.pid, exited, returncode, timeout, output)


def _result(
    pid: int, exited: bool, returncode: int | None, timeout: float, output: str
) -> ProbeResult:
    if not exited:
        reason = f"probe did not finish within {timeout:g}s (killed)"
        if returncode is None:
            reason += "; it is still there after SIGKILL (stuck in the driver?)"
        return ProbeResult(False, reason, returncode, True, output, pid)
    if returncode == 0:
        return ProbeResult(True, "", 0, False, output, pid)
    last_line = output.strip().splitlines()[-1] if output.strip() else ""
    reason = f"probe failed with {_describe_status(returncode)}"
    if last_line:
        reason += f": {last_line}"
    return ProbeResult(False, reason, returncode, False, output, pid)


def _describe_status(returncode: int | None) -> str:
    if returncode is None:
        return "no exit status"
    if returncode < 0:
        return f"signal {signal.Signals(-returncode).name}"
    return f"exit status {returncode}"


def _wait_unreaped(
    pid: int, deadline: float, clock: Callable[[], float], sleep: Callable[[float], None]
) -> bool:
    """Wait until ``pid`` exits or ``deadline``, leaving it unreaped (WNOWAIT)."""
    delay = 0.005
    while True:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if info is not None and info.si_pid == pid:
            return True
        remaining = deadline - clock()
        if remaining <= 0:
            return False
        sleep(min(delay, remaining))
        delay = min(delay * 2, 0.1)


def _kill_group(pgid: int) -> None:
    # ProcessLookupError: the group is already empty.
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _reap(
    proc: subprocess.Popen[bytes],
    deadline: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> int | None:
    """Reap the leader; ``None`` if it is still alive at ``deadline``."""
    if not _wait_unreaped(proc.pid, deadline, clock, sleep):
        return None
    return proc.wait()


def _tail(out: IO[bytes]) -> str:
    out.seek(0)
    return out.read()[-_OUTPUT_LIMIT:].decode(errors="replace")
