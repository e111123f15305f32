"""What a fleet pays for a policy change: time to the last agent, bytes per agent, etcd CPU.

``agents`` simulated agents' watches run in ``processes`` processes
(:mod:`bench.fanout_watchers`), each watch opened the way the agent's
store link opens it (a thread and a connection per watch, allocator's own
etcd client) on the keys a real agent watches (:func:`agent_watch_keys`).
Every agent also watches one plain key, the same way. Then, in rounds:

* an all-host change (a job's definition, which every agent must see) is
  applied through the library (``Allocator.apply_policy``); timed from its
  first write to the moment the last agent's watch has an event, with the
  bytes each agent's watches received and etcd's CPU time meanwhile;
* baseline: a bare client (:mod:`bench.bare_etcd`) puts the plain key with a
  value as large as what each agent just received; timed from the put to
  the last agent's event on the plain watch (same watchers, same processes);
* a one-host change elsewhere (one host's GPU count): the bytes each other
  agent's watches received.

Arrivals are stamped on ``CLOCK_MONOTONIC``, shared by every process of the
host. A change is over once every agent expected to see it has, and then
nothing more arrived for :data:`QUIET_S`.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psutil

from allocator.control.client import Allocator
from allocator.records.keys import KeyLayout
from allocator.store import Store, open_store
from bench.bare_etcd import BareEtcd
from bench.common import REPO, Row, ratio_row, value_row
from bench.fanout_watchers import shared_clock
from bench.fleet import fleet_policy, host_name
from tests.support.etcd_server import EtcdServer

__all__ = ["agent_watch_keys", "rows"]

ROOT, PLAIN = "/fanout", "/plain/"
PLAIN_KEY = PLAIN + "policy"
#: Nothing more arrived for this long: a change has reached everyone it will reach.
QUIET_S = 0.5
DEADLINE_S = 120.0
KB = 1000

#: What one agent's watches received since the mark: first arrival, bytes, events.
Arrival = tuple[float | None, int, int]


def agent_watch_keys(
    store: Store, layout: KeyLayout, hosts: Sequence[str]
) -> list[tuple[str, ...]]:
    """The keys and prefixes each host's agent watches, as the agent itself lists them.

    The whole policy record or the shares, as the agent's policy reader
    decides from what is stored: once, since that is the fleet's state, not
    a host's.
    """
    from allocator.agent.sync.policy_read import PolicyReader
    from allocator.agent.sync.watches import agent_watch_keys as watched

    _, read = PolicyReader(layout, hosts[0]).read(store)
    return [watched(layout, host, whole_policy=read.whole) for host in hosts]


def policy_text(hosts: int, version: int, gpus_of_first: int = 8) -> str:
    """The fleet's policy with job ``train`` at ``version`` and the first host's GPU count."""
    text = fleet_policy(hosts)
    job = "command: [python, -m, train]"
    first = f"{host_name(0)}: {{gpus: 8}}"
    assert job in text and first in text, "bench.fleet's policy changed shape"
    text = text.replace(job, f"command: [python, -m, train, --v{version}]")
    return text.replace(first, f"{host_name(0)}: {{gpus: {gpus_of_first}}}")


class Watchers:
    """The watcher processes: start, mark, collect what arrived."""

    def __init__(
        self, url: str, agents: Sequence[Sequence[str]], processes: int, revision: int
    ) -> None:
        share = -(-len(agents) // processes)
        self.groups = [agents[i : i + share] for i in range(0, len(agents), share)]
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "bench.fanout_watchers"],
                cwd=REPO,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in self.groups
        ]
        try:
            for proc, group in zip(self.procs, self.groups, strict=True):
                config = {"url": url, "revision": revision, "agents": [list(a) for a in group]}
                self._send(proc, json.dumps(config))
            for proc in self.procs:
                self._answer(proc)  # "ready", once etcd created every watch it asked for
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _send(proc: subprocess.Popen[str], line: str) -> None:
        stdin: IO[str] | None = proc.stdin
        assert stdin is not None
        stdin.write(line + "\n")
        stdin.flush()

    @staticmethod
    def _answer(proc: subprocess.Popen[str]) -> dict[str, Any]:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        try:
            answer: dict[str, Any] = json.loads(line) if line else {"error": "no answer"}
        except ValueError:
            answer = {"error": line[:500]}
        if "error" in answer:
            raise SystemExit(f"watcher process: {answer['error']}")
        return answer

    def mark(self) -> None:
        """Forget every arrival so far."""
        for proc in self.procs:
            self._send(proc, "mark")
        for proc in self.procs:
            self._answer(proc)

    def report(self, prefix: str) -> list[Arrival]:
        """Per agent, on its watches under ``prefix``: first arrival, bytes, events."""
        for proc in self.procs:
            self._send(proc, f"report {prefix}")
        found: list[Arrival] = []
        for proc in self.procs:
            found += [(a[0], a[1], a[2]) for a in self._answer(proc)["agents"]]
        return found

    def settled(
        self, prefix: str, expected: Sequence[int], at_seen: Callable[[], float]
    ) -> tuple[list[Arrival], float]:
        """Wait until the agents ``expected`` saw something and then nothing more came.

        Returns what arrived, and ``at_seen()`` as it was once all of them had
        seen it (before the quiet wait, so that idle time is left out).
        """
        deadline = time.monotonic() + DEADLINE_S
        last: list[Arrival] = []
        seen: float | None = None
        quiet_since = time.monotonic()
        waiting = list(expected)
        while time.monotonic() < deadline:
            found = self.report(prefix)
            if found != last:
                last, quiet_since = found, time.monotonic()
            waiting = [i for i in expected if found[i][0] is None]
            if not waiting and seen is None:
                seen = at_seen()
            if seen is not None and time.monotonic() - quiet_since >= QUIET_S:
                return found, seen
            time.sleep(0.05)
        raise SystemExit(f"{len(waiting)} of {len(expected)} watchers never saw the change")

    def close(self) -> None:
        """End every process."""
        for proc in self.procs:
            with contextlib.suppress(OSError):  # it ended already
                self._send(proc, "stop")
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class Applier:
    """Applies the fleet's policy through the library, noting when its first write is sent."""

    def __init__(self, store: Store, hosts: int) -> None:
        self.allocator = Allocator(store, prefix=ROOT, actor="bench@fanout")
        self.hosts = hosts
        self.version, self.gpus = 0, 8
        self.first_write: float | None = None
        for name in ("txn", "txn_or_read", "put", "delete"):
            setattr(store, name, self._noted(getattr(store, name)))

    def _noted(self, call: Callable[..., Any]) -> Callable[..., Any]:
        def noted(*args: Any, **kwargs: Any) -> Any:
            if self.first_write is None:
                self.first_write = shared_clock()
            return call(*args, **kwargs)

        return noted

    def apply(self, *, job: bool = False, host: bool = False) -> float:
        """Change the job and/or the first host's GPU count; when the first write went."""
        self.version += job
        self.gpus = (15 - self.gpus) if host else self.gpus  # 8 <-> 7
        self.first_write = None
        self.allocator.apply_policy(policy_text(self.hosts, self.version, self.gpus), "f.yaml")
        assert self.first_write is not None
        return self.first_write


@dataclass
class Samples:
    """What the rounds measured."""

    agents: range
    ours_s: list[float]
    plain_s: list[float]
    all_bytes: list[float]
    one_bytes: list[float]
    cpu_s: list[float]
    one_cpu_s: list[float]


Cpu = Callable[[], float]


def cpu_of(pid: int) -> Cpu:
    """Seconds of CPU process ``pid`` has used so far (user and system), when called."""
    process = psutil.Process(pid)

    def used() -> float:
        times = process.cpu_times()
        return float(times.user + times.system)

    return used


def _round(
    watchers: Watchers, applier: Applier, bare: BareEtcd, etcd: Cpu, samples: Samples
) -> None:
    """An all-host change, the plain key, a one-host change: each once."""
    n = len(samples.agents)
    watchers.mark()
    cpu = etcd()
    sent = applier.apply(job=True)
    found, cpu_seen = watchers.settled(ROOT, samples.agents, etcd)
    samples.cpu_s.append((cpu_seen - cpu) / n)
    samples.ours_s.append(max(f[0] or 0 for f in found) - sent)
    per_agent = sum(f[1] for f in found) / n
    samples.all_bytes.append(per_agent)

    watchers.mark()
    sent = shared_clock()
    bare.put(PLAIN_KEY.encode(), b"x" * max(1, round(per_agent) - len(PLAIN_KEY)))
    found, _ = watchers.settled(PLAIN, samples.agents, etcd)
    samples.plain_s.append(max(f[0] or 0 for f in found) - sent)

    watchers.mark()
    cpu = etcd()
    applier.apply(host=True)
    found, cpu_seen = watchers.settled(ROOT, [0], etcd)
    samples.one_cpu_s.append((cpu_seen - cpu) / n)
    samples.one_bytes.append(max((f[1] for f in found[1:]), default=0))


def measure(server: EtcdServer, agents: int, processes: int, rounds: int) -> Samples:
    """Start the watchers, run ``rounds`` rounds, stop them."""
    pid = server.pid
    assert pid is not None
    layout = KeyLayout(ROOT)
    samples = Samples(range(agents), [], [], [], [], [], [])
    store = open_store(server.url)
    bare = BareEtcd(server.endpoint)
    try:
        applier = Applier(store, agents)
        applier.apply()
        hosts = [host_name(i) for i in range(agents)]
        watched = [(*keys, PLAIN) for keys in agent_watch_keys(store, layout, hosts)]
        revision = bare.put(PLAIN_KEY.encode(), b"0")  # the store's latest revision
        watchers = Watchers(server.url, watched, processes, revision)
        try:
            for _ in range(rounds):
                _round(watchers, applier, bare, cpu_of(pid), samples)
        finally:
            watchers.close()
    finally:
        bare.close()
        store.close()
    return samples


def rows(args: Any, work: Path) -> list[Row]:
    """The fan-out, bytes and etcd CPU rows, on an etcd of their own."""
    agents, processes = args.agents, args.watcher_processes
    server = EtcdServer(work / "etcd-fanout")
    server.start()
    try:
        # Twice the other groups' rounds: one slow round of a loaded machine
        # moves a median of five.
        got = measure(server, agents, processes, 2 * args.applies)
    finally:
        server.stop()
    median = statistics.median(got.cpu_s) * 1000
    one = statistics.median(got.one_cpu_s) * 1000
    return [
        ratio_row(
            f"fan-out: last of {agents} watchers ({processes} processes) sees a policy change"
            " vs a plain key",
            got.ours_s,
            got.plain_s,
            most=3,
            note="from the apply's first write; plain key as large as each agent's share",
        ),
        value_row(
            "policy bytes per agent per apply (all-host change)",
            max(got.all_bytes) / KB,
            4,
            "KB",
            samples=len(got.all_bytes),
            note="a job's definition changed; event keys and values on the agent's watches",
        ),
        value_row(
            "policy bytes per agent per one-host change elsewhere",
            max(got.one_bytes) / KB,
            4,
            "KB",
            samples=len(got.one_bytes),
            note="the most any agent but the changed host's received",
        ),
        value_row(
            "etcd CPU per apply per agent",
            median,
            0.5,
            "ms",
            samples=len(got.cpu_s),
            note=f"all-host change; a one-host change: {one:.3f} ms",
        ),
    ]
