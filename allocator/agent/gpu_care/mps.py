"""One NVIDIA MPS control daemon per GPU, while any job uses that GPU in an MPS pool.

For each such GPU the agent runs ``nvidia-cuda-mps-control -d`` with only that
GPU visible (its UUID) and a pipe and log directory of its own under the
agent's state directory (:func:`allocator.agent.planning.gpu_shares.mps_pipe_dir`); the
daemon writes ``nvidia-cuda-mps-control.pid`` into its pipe directory, and a
live process under that pid is what "up" means. A worker never starts before
its daemon is up: :meth:`MpsDaemons.wanted` says which daemons to run and
which to stop (:class:`RunMps`, :class:`QuitMps`), the loop has
:meth:`MpsDaemons.carry_out` do so, and :meth:`MpsDaemons.hold_starts` holds
back a ``Start`` whose daemon is not up yet; the loop asks again on its next
tick. A daemon that dies while wanted is started again (with a growing delay
if it keeps failing); when the last job using a GPU is gone, its daemon is
told ``quit`` through ``nvidia-cuda-mps-control`` with the same pipe
directory, and killed if it is still there after :data:`QUIT_SECONDS`.

Nothing here blocks: a daemon is started, or told to quit, by a short-lived
``nvidia-cuda-mps-control`` process that is reaped on a later call. Daemons
outlive the agent (like its workers): a restarted agent finds them by their
pid files, keeps those still wanted and stops the others.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, assert_never

from allocator.agent.kernel import procs
from allocator.agent.planning.gpu_shares import daemon_device, mps_log_dir, mps_pipe_dir
from allocator.agent.planning.types import Action, DesiredJob, JobView, Start
from allocator.records.gpu_info import GpuInfo

__all__ = [
    "CONTROL",
    "PID_FILE",
    "QUIT_SECONDS",
    "MpsAction",
    "MpsDaemons",
    "QuitMps",
    "RunMps",
    "mps_clients",
]

#: The MPS control program, looked up on the agent's PATH.
CONTROL = "nvidia-cuda-mps-control"
#: What the control daemon writes into its pipe directory (NVIDIA's MPS documentation).
PID_FILE = "nvidia-cuda-mps-control.pid"
#: How long a daemon told to quit may take before it is killed.
QUIT_SECONDS = 10.0
#: How long a started daemon may take to write its pid file before the start counts as failed.
START_SECONDS = 10.0
_RETRY_SECONDS = 1.0
_RETRY_MAX_SECONDS = 30.0

Logger = Callable[[str, Mapping[str, Any]], None]


def mps_clients(desired: Mapping[str, DesiredJob]) -> dict[str, frozenset[int]]:
    """Job -> the GPUs its workers use through MPS (pure: read from their environments)."""
    clients: dict[str, frozenset[int]] = {}
    for name, want in desired.items():
        gpus = {
            gpu
            for worker in want.workers
            if "CUDA_MPS_PIPE_DIRECTORY" in worker.env
            for gpu in worker.gpus
        }
        if want.state == "run" and gpus:
            clients[name] = frozenset(gpus)
    return clients


@dataclass(frozen=True, slots=True)
class RunMps:
    """Keep ``gpu``'s control daemon up (start it, or again after it died), seeing ``device``."""

    gpu: int
    device: str


@dataclass(frozen=True, slots=True)
class QuitMps:
    """Tell ``gpu``'s control daemon to quit (killed if it is still there after a while)."""

    gpu: int


MpsAction = RunMps | QuitMps


@dataclass(slots=True)
class _Daemon:
    """The agent's view of one GPU's daemon."""

    gpu: int
    device: str
    pid: int | None = None  # the daemon's, once its pid file names a live one
    launcher: subprocess.Popen[bytes] | None = None  # ``-d`` (it forks, then exits)
    started_at: float | None = None  # when the last start was launched
    failures: int = 0
    retry_at: float = 0.0
    quitter: subprocess.Popen[bytes] | None = None
    quit_by: float | None = None  # set once told to quit: killed after this


@dataclass(slots=True)
class MpsDaemons:
    """The MPS control daemons of one agent, under ``root`` (one directory per GPU)."""

    root: Path
    log: Logger
    environ: Mapping[str, str]
    daemons: dict[int, _Daemon] = field(default_factory=dict)
    leaving: dict[int, _Daemon] = field(default_factory=dict)
    users: dict[str, frozenset[int]] = field(default_factory=dict)  # job -> GPUs, while it runs
    held: set[str] = field(default_factory=set)  # jobs whose start waits for a daemon

    def __post_init__(self) -> None:
        """Find the daemons a previous agent left running (each GPU's pid file)."""
        for pid_file in sorted(self.root.glob(f"gpu*/pipe/{PID_FILE}")):
            gpu_dir = pid_file.parent.parent.name
            pid = _read_pid(pid_file)
            if gpu_dir[3:].isdigit() and pid is not None and _alive(pid):
                gpu = int(gpu_dir[3:])
                self.daemons[gpu] = _Daemon(gpu, "", pid=pid)
                self.log("mps-adopted", {"gpu": gpu, "pid": pid})

    @property
    def waiting(self) -> bool:
        """Whether a start is held for a daemon, or a daemon is on its way up or down."""
        busy = any(d.pid is None for d in self.daemons.values())
        return bool(self.held) or busy or bool(self.leaving)

    def wanted(
        self,
        desired: Mapping[str, DesiredJob],
        views: Mapping[str, JobView],
        inventory: Sequence[GpuInfo] | None,
    ) -> list[MpsAction]:
        """The daemons what runs (or should) needs, and those nobody needs any more.

        Decides only (it notes which job uses which GPU); :meth:`carry_out` acts.
        A GPU whose daemon is still leaving gets a new one once it is gone.
        """
        self._track_users(mps_clients(desired), views)
        wanted = {gpu for gpus in self.users.values() for gpu in gpus}
        quit_: list[MpsAction] = [QuitMps(gpu) for gpu in sorted(self.daemons.keys() - wanted)]
        run: list[MpsAction] = [
            RunMps(gpu, self._device(gpu, inventory))
            for gpu in sorted(wanted - self.leaving.keys())
        ]
        return run + quit_

    def carry_out(self, actions: Sequence[MpsAction], now: float) -> None:
        """Start, tend and stop daemons as ``actions`` say; never waits for one."""
        for action in actions:
            match action:
                case RunMps(gpu, device):
                    daemon = self.daemons.setdefault(gpu, _Daemon(gpu, ""))
                    daemon.device = daemon.device or device
                case QuitMps(gpu):
                    if gpu in self.daemons:
                        self._quit(self.daemons.pop(gpu), now)
                case _:
                    assert_never(action)
        for daemon in list(self.daemons.values()):
            self._tend(daemon, now)
        for daemon in list(self.leaving.values()):
            self._see_off(daemon, now)

    def hold_starts(
        self, actions: Sequence[Action], desired: Mapping[str, DesiredJob]
    ) -> list[Action]:
        """``actions`` less the starts whose GPUs' daemons are not up yet (asked again later)."""
        clients = mps_clients(desired)
        return [a for a in actions if not self._holds(a, clients)]

    def _device(self, gpu: int, inventory: Sequence[GpuInfo] | None) -> str:
        """The device a GPU's daemon sees: the one it was started with, else the inventory's."""
        daemon = self.daemons.get(gpu)
        return (daemon.device if daemon is not None else "") or daemon_device(gpu, inventory)

    def stop_all(self, now: float) -> None:
        """Tell every daemon to quit (the agent is stopping, its workers gone)."""
        for gpu in sorted(self.daemons):
            self._quit(self.daemons.pop(gpu), now)
        for daemon in self.leaving.values():
            for helper in (daemon.quitter, daemon.launcher):
                if helper is not None:  # short-lived: reap them rather than leave zombies
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        helper.wait(1.0)

    # --- who needs which daemon -------------------------------------------------

    def _track_users(
        self, clients: Mapping[str, frozenset[int]], views: Mapping[str, JobView]
    ) -> None:
        """A job uses a GPU's daemon while it should, and while its old workers still run."""
        users: dict[str, frozenset[int]] = {}
        for job in clients.keys() | self.users.keys():
            view = views.get(job)
            still = (
                self.users.get(job, frozenset()) if view is not None and view.alive else frozenset()
            )
            gpus = clients.get(job, frozenset()) | still
            if gpus:
                users[job] = gpus
        self.users = users

    def _holds(self, action: Action, clients: Mapping[str, frozenset[int]]) -> bool:
        if not isinstance(action, Start) or action.job not in clients:
            return False
        missing = sorted(g for g in clients[action.job] if not self._up(g))
        if not missing:
            self.held.discard(action.job)
            return False
        if action.job not in self.held:
            self.held.add(action.job)
            self.log("mps-waiting", {"job": action.job, "gpus": missing})
        return True

    def _up(self, gpu: int) -> bool:
        daemon = self.daemons.get(gpu)
        return daemon is not None and daemon.pid is not None

    # --- one daemon's life ---------------------------------------------------------

    def _tend(self, daemon: _Daemon, now: float) -> None:
        """Move a wanted daemon towards "up": reap its launcher, read its pid, (re)start it."""
        if daemon.launcher is not None:
            code = daemon.launcher.poll()
            if code is None:
                return
            daemon.launcher = None
            if code != 0:
                self._failed(daemon, now, f"{CONTROL} -d exited with {code}")
                return
        pid = _read_pid(self._pipe(daemon.gpu) / PID_FILE)
        if pid is not None and _alive(pid):
            if daemon.pid != pid:
                daemon.pid, daemon.failures = pid, 0
                self.log("mps-daemon-up", {"gpu": daemon.gpu, "pid": pid})
            return
        if daemon.pid is not None:
            self.log("mps-daemon-died", {"gpu": daemon.gpu, "pid": daemon.pid})
            daemon.pid, daemon.started_at = None, None
        if daemon.started_at is not None and now - daemon.started_at < START_SECONDS:
            return  # launched: the pid file comes once the daemon is ready
        if daemon.started_at is not None:
            self._failed(daemon, now, f"no live daemon {START_SECONDS:g} s after {CONTROL} -d")
        elif now >= daemon.retry_at:
            self._start(daemon, now)

    def _start(self, daemon: _Daemon, now: float) -> None:
        pipe, logs = self._pipe(daemon.gpu), Path(mps_log_dir(str(self.root), daemon.gpu))
        try:
            for directory in (pipe, logs):
                directory.mkdir(parents=True, exist_ok=True)
                directory.chmod(0o755)  # the jobs' users connect through it
            with (logs / "launch.log").open("ab") as out:
                daemon.launcher = subprocess.Popen(
                    [CONTROL, "-d"],
                    env=self._env(daemon.gpu, daemon.device),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as exc:
            self._failed(daemon, now, f"cannot run {CONTROL}: {exc.strerror or exc}")
            return
        daemon.started_at = now
        self.log("mps-daemon-start", {"gpu": daemon.gpu, "device": daemon.device})

    def _failed(self, daemon: _Daemon, now: float, error: str) -> None:
        delay = min(_RETRY_SECONDS * 2.0 ** min(daemon.failures, 16), _RETRY_MAX_SECONDS)
        daemon.failures += 1
        daemon.retry_at, daemon.started_at = now + delay, None
        self.log("mps-daemon-failed", {"gpu": daemon.gpu, "error": error, "retry_in": delay})

    def _quit(self, daemon: _Daemon, now: float) -> None:
        """Ask the daemon to quit (``echo quit | nvidia-cuda-mps-control``); see it off later."""
        daemon.quit_by = now + QUIT_SECONDS
        self.leaving[daemon.gpu] = daemon
        if daemon.pid is None and daemon.launcher is None:
            return  # never came up: nothing to ask
        try:
            daemon.quitter = subprocess.Popen(
                [CONTROL],
                env=self._env(daemon.gpu, daemon.device),
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
            assert daemon.quitter.stdin is not None
            with contextlib.suppress(OSError):
                daemon.quitter.stdin.write(b"quit\n")
                daemon.quitter.stdin.close()
        except OSError as exc:
            self.log("mps-quit-failed", {"gpu": daemon.gpu, "error": exc.strerror or str(exc)})
        self.log("mps-daemon-quit", {"gpu": daemon.gpu, "pid": daemon.pid})

    def _see_off(self, daemon: _Daemon, now: float) -> None:
        """Reap a leaving daemon's helpers; kill it once its time is up; forget it when gone."""
        pid = daemon.pid or _read_pid(self._pipe(daemon.gpu) / PID_FILE)
        alive = pid is not None and _alive(pid)
        if alive and daemon.quit_by is not None and now < daemon.quit_by:
            return
        if alive and pid is not None:
            procs.signal_process(pid, signal.SIGKILL)
            self.log("mps-daemon-killed", {"gpu": daemon.gpu, "pid": pid})
            return  # reaped (if ours) and forgotten on a later call
        if any(h is not None and h.poll() is None for h in (daemon.quitter, daemon.launcher)):
            return  # forgotten once its helpers are reaped too
        del self.leaving[daemon.gpu]
        self.log("mps-daemon-stopped", {"gpu": daemon.gpu})

    def _pipe(self, gpu: int) -> Path:
        return Path(mps_pipe_dir(str(self.root), gpu))

    def _env(self, gpu: int, device: str) -> dict[str, str]:
        env = {k: self.environ[k] for k in ("PATH", "LD_LIBRARY_PATH") if k in self.environ}
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(self._pipe(gpu))
        env["CUDA_MPS_LOG_DIRECTORY"] = mps_log_dir(str(self.root), gpu)
        if device:
            env["CUDA_VISIBLE_DEVICES"] = device
        return env


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isascii() and text.isdigit() and int(text) > 0 else None


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live MPS control daemon (a zombie of ours is reaped, and is not)."""
    stat = procs.read_stat(pid)
    if stat is None:
        return False
    if stat.state == "Z":
        if stat.ppid == os.getpid():  # the agent is a subreaper: an orphaned daemon is its child
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        return False
    try:
        return CONTROL.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
