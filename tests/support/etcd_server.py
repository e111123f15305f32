"""A real etcd server for tests: free loopback ports, own data dir, clean stop.

Starts the ``etcd`` binary (Debian's ``etcd-server``), waits until its
``/health`` endpoint answers (polled with a deadline, never a fixed sleep),
and stops it by PID. ``restart()`` keeps the ports and the data, so a test
can take the store away and bring it back; ``kill()`` crashes it (restart
it with ``restart()``), ``pause()``/``resume()`` freeze it (SIGSTOP/SIGCONT).

Optional extras a test can ask for:

* ``auth=True``: a ``root`` user (password :attr:`EtcdServer.root_password`)
  is created and authentication enabled; :meth:`EtcdServer.etcdctl` runs as
  root, so the test can add its own roles and users;
* ``tls=TlsFiles(...)``: the client port speaks TLS only and :attr:`url`
  uses ``etcds://``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["EtcdNotAvailable", "EtcdServer", "TlsFiles", "free_port", "wait_stopped"]

ROOT_PASSWORD = "root-secret"
_POLL_INTERVAL = 0.02
_LOG_TAIL_LINES = 20


class EtcdNotAvailable(RuntimeError):
    """The etcd binary is missing or the server did not become healthy."""


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for a TLS client port: the CA that signed ``cert``, and its key.

    With ``client_auth`` the server also demands a client certificate signed
    by ``ca`` (the health check then presents ``cert``, so it must allow
    client use too).
    """

    ca: Path
    cert: Path
    key: Path
    client_auth: bool = False


def free_port() -> int:
    """Return a loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Kill and reap ``proc`` if it still runs (an interrupted run must not leak etcd)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    """The log's complaints (lines that look like errors) and then its last lines."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    early = text[:-lines]
    complaints = [
        line
        for line in early
        if any(word in line.lower() for word in ("error", "fatal", "not defined", "panic"))
    ]
    return "\n".join([*complaints[:5], *text[-lines:]])


class EtcdServer:
    """One single-member etcd cluster on loopback, owned by a test."""

    def __init__(
        self,
        data_dir: Path,
        *,
        auth: bool = False,
        tls: TlsFiles | None = None,
        extra_args: Sequence[str] = (),
        binary: str = "etcd",
    ) -> None:
        self.data_dir = Path(data_dir)
        self.auth = auth
        self.tls = tls
        self.extra_args = tuple(extra_args)
        self.binary = binary
        self.root_password = ROOT_PASSWORD
        self.client_port = 0
        self.peer_port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._reaper: weakref.finalize[..., EtcdServer] | None = None
        self._log_file: Path = self.data_dir / "etcd.log"
        self._auth_enabled = False

    # --- addresses -----------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:PORT`` of the client port."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        """The store URL for this server (``etcd://`` or ``etcds://``)."""
        scheme = "etcds" if self.tls else "etcd"
        return f"{scheme}://{self.endpoint}"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs, else ``None``."""
        if self._proc is None or self._proc.poll() is not None:
            return None
        return self._proc.pid

    @property
    def log_path(self) -> Path:
        """Where the server's stdout and stderr go."""
        return self._log_file

    # --- lifecycle -----------------------------------------------------------

    def start(self, timeout: float = 15) -> None:
        """Start on fresh free ports and wait until healthy (and set up auth)."""
        if shutil.which(self.binary) is None:
            raise EtcdNotAvailable(
                f"{self.binary!r} not found on PATH (apt-get install etcd-server)"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Another process may grab a port between free_port() and etcd's bind:
        # try a few fresh pairs before giving up.
        last_error: EtcdNotAvailable | None = None
        for _attempt in range(3):
            self.client_port, self.peer_port = free_port(), free_port()
            try:
                self._launch(timeout)
                break
            except EtcdNotAvailable as exc:
                last_error = exc
                if "address already in use" not in str(exc):
                    raise
        else:
            assert last_error is not None
            raise last_error
        if self.auth and not self._auth_enabled:
            self._enable_auth()

    def restart(self, timeout: float = 15) -> None:
        """Stop (if running) and start again on the same ports with the same data."""
        self.stop()
        self._launch(timeout)

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL. Safe to call twice."""
        self._end(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL now (a crash, as the clients see it) and reap the process."""
        self._end(signal.SIGKILL, 10)

    def pause(self) -> None:
        """SIGSTOP: the server keeps its sockets but answers nothing (a hung host).

        Returns once every thread of it is stopped: the signal is delivered
        asynchronously, and a busy machine may let etcd answer one more request.
        """
        assert self._proc is not None and self._proc.poll() is None, "etcd is not running"
        os.kill(self._proc.pid, signal.SIGSTOP)
        wait_stopped(self._proc.pid)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        assert self._proc is not None, "etcd is not running"
        os.kill(self._proc.pid, signal.SIGCONT)

    def __enter__(self) -> EtcdServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- helpers for tests ---------------------------------------------------

    def etcdctl(self, *args: str, user: str | None = None, check: bool = True) -> str:
        """Run ``etcdctl`` against this server (as root once auth is on); return stdout."""
        cmd = ["etcdctl", "--endpoints", self._client_url(), "--command-timeout=5s"]
        if self.tls:
            cmd += ["--cacert", str(self.tls.ca)]
            if self.tls.client_auth:
                cmd += ["--cert", str(self.tls.cert), "--key", str(self.tls.key)]
        if user is not None:
            cmd += ["--user", user]
        elif self._auth_enabled:
            cmd += ["--user", f"root:{self.root_password}"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL_")}
        env["ETCDCTL_API"] = "3"
        done = subprocess.run(
            [*cmd, *args], capture_output=True, text=True, env=env, timeout=30, check=False
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"etcdctl {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def requests_served(self, method: str, service: str = "etcdserverpb.KV") -> int:
        """How many ``method`` calls (``Range``, ``Txn``...) the server has started (/metrics)."""
        needle = f'grpc_method="{method}",grpc_service="{service}"'
        with self._opener().open(f"{self._client_url()}/metrics", timeout=5) as response:
            text = response.read().decode()
        for line in text.splitlines():
            if line.startswith("grpc_server_started_total{") and needle in line:
                return int(float(line.rsplit(" ", 1)[1]))
        return 0

    # --- internals -----------------------------------------------------------

    def _client_url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{self.endpoint}"

    def _command(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer_port}"
        cmd = [
            self.binary,
            "--name=t",
            f"--data-dir={self.data_dir / 'data'}",
            f"--listen-client-urls={self._client_url()}",
            f"--advertise-client-urls={self._client_url()}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=t={peer}",
            "--logger=zap",
            # One member on loopback: a short election makes start-up fast and
            # cannot cause spurious elections (there is no peer to lose).
            "--election-timeout=200",
            "--heartbeat-interval=20",
        ]
        if self.tls:
            cmd += [f"--cert-file={self.tls.cert}", f"--key-file={self.tls.key}"]
            if self.tls.client_auth:
                cmd += ["--client-cert-auth", f"--trusted-ca-file={self.tls.ca}"]
        return [*cmd, *self.extra_args]

    def _launch(self, timeout: float) -> None:
        self._spawn()
        try:
            self._wait_healthy(timeout)
        except BaseException:
            self.kill()
            raise

    def _spawn(self) -> None:
        """Start the process, not waiting for it (a cluster's members must all be up first)."""
        with self._log_file.open("ab") as log:
            self._proc = subprocess.Popen(
                self._command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                # Not the test's own variables: a server first started inside an
                # `allocator.lease()` block would carry its ALLOCATOR_HOLDING, and an
                # agent ending that holding stops every process that carries it.
                env={k: v for k, v in os.environ.items() if not k.startswith("ALLOCATOR_")},
            )
        self._reaper = weakref.finalize(self, _reap, self._proc)

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise EtcdNotAvailable(
                    f"etcd exited with {self._proc.returncode} during start-up; "
                    f"log tail:\n{_tail(self._log_file)}"
                )
            if self._healthy():
                return
            time.sleep(_POLL_INTERVAL)
        raise EtcdNotAvailable(
            f"etcd on {self.endpoint} not healthy after {timeout} s; "
            f"log tail:\n{_tail(self._log_file)}"
        )

    def _opener(self) -> urllib.request.OpenerDirector:
        context: ssl.SSLContext | None = None
        if self.tls:
            context = ssl.create_default_context(cafile=str(self.tls.ca))
            if self.tls.client_auth:
                context.load_cert_chain(str(self.tls.cert), str(self.tls.key))
        # No proxy: a proxy from the environment must not see loopback traffic.
        return urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
        )

    def _healthy(self) -> bool:
        try:
            with self._opener().open(f"{self._client_url()}/health", timeout=1) as response:
                return b'"health":"true"' in response.read()
        except (OSError, urllib.error.URLError):
            return False

    def _enable_auth(self) -> None:
        self.etcdctl("user", "add", f"root:{self.root_password}")
        self.etcdctl("role", "add", "root")
        self.etcdctl("user", "grant-role", "root", "root")
        self.etcdctl("auth", "enable")
        self._auth_enabled = True

    def _end(self, sig: signal.Signals, timeout: float) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)  # a paused server cannot act on SIGTERM
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
        self._proc = None
        if self._reaper is not None:
            self._reaper.detach()
            self._reaper = None


def wait_stopped(pid: int, timeout: float = 10.0) -> None:
    """Wait until every thread of ``pid`` is stopped (state ``T`` in ``/proc``), after SIGSTOP."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
            with contextlib.suppress(OSError):
                states.append(stat.read_text().rpartition(")")[2].split()[0])
        if states and all(state in ("T", "t") for state in states):
            return
        time.sleep(0.005)
    raise AssertionError(f"process {pid} is not stopped {timeout:.0f} s after SIGSTOP")
