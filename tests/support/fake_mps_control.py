"""A stand-in for ``nvidia-cuda-mps-control``, installed on PATH by :func:`install_fake_mps`.

It keeps to what NVIDIA documents of the real one, as far as the agent relies on it:

* ``-d``: start the control daemon in the background and return at once
  (exit 0). The daemon writes ``nvidia-cuda-mps-control.pid`` into
  ``$CUDA_MPS_PIPE_DIRECTORY``, and appends one JSON line (its pid, its
  ``CUDA_VISIBLE_DEVICES`` and directories) to ``control.log`` in
  ``$CUDA_MPS_LOG_DIRECTORY``; then it waits until told to quit;
* no option: a client reading commands from stdin; ``quit`` ends the daemon
  whose pid file is in ``$CUDA_MPS_PIPE_DIRECTORY`` (the daemon removes it).

With ``FAKE_MPS_FAIL`` in the pipe directory (a file), ``-d`` fails with exit 1.
Standard library only: it runs as a program (its shebang is the test's Python).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

PID_FILE = "nvidia-cuda-mps-control.pid"


def install_fake_mps(directory: Path) -> Path:
    """Write the fake as ``directory/nvidia-cuda-mps-control``; return ``directory`` (for PATH)."""
    directory.mkdir(parents=True, exist_ok=True)
    program = directory / "nvidia-cuda-mps-control"
    program.write_text(f"#!{sys.executable}\n" + Path(__file__).read_text())
    program.chmod(0o755)
    return directory


def _daemon(pipe: Path, logs: Path) -> None:
    os.setsid()
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    record = {
        "pid": os.getpid(),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(logs),
    }
    with (logs / "control.log").open("a") as log:
        log.write(json.dumps(record) + "\n")
    tmp = pipe / f"{PID_FILE}.tmp"
    tmp.write_text(f"{os.getpid()}\n")
    os.replace(tmp, pipe / PID_FILE)  # whole, or not at all
    while not stopping:
        time.sleep(0.02)
    (pipe / PID_FILE).unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
    logs = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))
    if argv == ["-d"]:
        if (pipe / "FAKE_MPS_FAIL").exists():
            print("fake mps: told to fail", file=sys.stderr)
            return 1
        if os.fork() == 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            _daemon(pipe, logs)
            os._exit(0)
        return 0
    for line in sys.stdin:
        if line.strip() == "quit":
            try:
                os.kill(int((pipe / PID_FILE).read_text()), signal.SIGTERM)
            except (OSError, ValueError):
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
