"""A store that does not answer never holds up supervision, signals or the watchdog.

Every store call runs in the agent's store link; the supervision loop keeps
its tick however long a call hangs. Each test makes store calls hang far
longer than the test waits (endpoints that take each request and never
answer, with a 30 s budget per call), so an agent that called the store
inline would miss every deadline here by many seconds.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agent_harness import AgentHarness, agent_policy, pid_alive
from tests.support.blackhole import Blackhole
from tests.support.notify_socket import NotifySocket
from tests.support.waiting import wait_for

#: Endpoints that never answer, tried in turn after the real one (each gets its share of 30 s).
HOLES = 8
#: How long the agent may take to react; far less than one hanging store call chain.
REACT_SECONDS = 15.0


@pytest.fixture
def holes() -> Iterator[list[str]]:
    """Endpoints that accept connections and never answer."""
    with ExitStack() as stack:
        listeners = [Blackhole() for _ in range(HOLES)]
        for listener in listeners:
            stack.callback(listener.close)
        yield [listener.endpoint for listener in listeners]


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


@pytest.mark.slow
def test_sigterm_stops_adopted_workers_promptly_while_every_store_endpoint_hangs(
    tmp_path: Path, prefix: str, holes: list[str]
) -> None:
    world = AgentHarness(tmp_path, f"sqlite://{tmp_path / 'store.db'}", prefix)
    notify = NotifySocket()
    try:
        world.apply_policy()
        world.start_agent("--keep-workers-on-exit")
        assert world.cli("set", "job=train", "gpus=0").code == 0
        assert world.cli("set", "job=stubborn", "gpus=1").code == 0
        train, stubborn = world.new_report("train"), world.new_report("stubborn")
        assert world.stop_agent() == 0  # workers kept, for the next agent to adopt

        # One endpoint that takes each request and never answers, and a 30 s budget:
        # the agent's first store call is still hanging when this test ends. (Spread
        # over all the holes, the budget would give each a few seconds, and a call
        # that may have been applied is not tried on the next: it would end early.)
        url = f"etcd://{holes[0]}?timeout=30"
        watchdog = {"NOTIFY_SOCKET": notify.address, "WATCHDOG_USEC": "400000"}
        world.start_agent("--store", url, env=watchdog, wait=False)
        assert world.process is not None
        notify.wait_for("READY=1", timeout=REACT_SECONDS)
        # Ready means adopted: the workers are supervised before any store answers.
        assert world.events("adopt")[-1]["adopted"] == ["stubborn", "train"]
        for _ in range(3):  # pings keep coming while every store call hangs
            notify.wait_for("WATCHDOG=1", timeout=REACT_SECONDS)

        # A stuck loop stops pinging, so systemd would restart the agent.
        os.kill(world.process.pid, signal.SIGSTOP)
        wait_for("the agent to be stopped", lambda: _state(world.process.pid) == "T")
        notify.drain()
        assert notify.receive(timeout=1.0) is None  # 5 ping intervals of 0.2 s: none came
        os.kill(world.process.pid, signal.SIGCONT)
        notify.wait_for("WATCHDOG=1", timeout=REACT_SECONDS)

        world.process.send_signal(signal.SIGTERM)
        assert world.process.wait(REACT_SECONDS) == 0
        notify.wait_for("STOPPING=1", timeout=1)
        # SIGTERM to both, then SIGKILL for the one that ignores it (and its child).
        for pid in (train["pid"], stubborn["pid"], stubborn["child_pid"]):
            assert not pid_alive(pid)
        assert world.events("killed", job="stubborn")
        assert world.events("withdraw-skipped")
    finally:
        if world.process is not None:
            with suppress(ProcessLookupError):
                os.kill(world.process.pid, signal.SIGCONT)
        notify.close()
        world.cleanup()


@pytest.fixture
def stoppable(tmp_path: Path, prefix: str, etcd_server_private: Any, holes: list[str]) -> Any:
    """An agent on a real etcd (listed first) and endpoints that hang (tried after it)."""
    # A long per-call deadline, shared by the endpoints: a read tries each in turn.
    url = "etcd://" + ",".join([etcd_server_private.endpoint, *holes]) + "?timeout=30"
    world = AgentHarness(tmp_path, url, prefix)
    policy = agent_policy(tmp_path)
    policy["jobs"]["stubborn"]["fallback"] = "cpu-2"
    try:
        world.apply_policy(policy)
        world.start_agent()
        yield world, etcd_server_private
    finally:
        if etcd_server_private.pid is not None:
            with suppress(ProcessLookupError):
                os.kill(etcd_server_private.pid, signal.SIGCONT)
        world.cleanup()


def test_crash_restart_and_sigkill_escalation_keep_time_while_etcd_is_stopped(
    stoppable: Any,
) -> None:
    world, etcd = stoppable
    assert world.cli("set", "job=train", "gpus=0").code == 0
    assert world.cli("set", "job=stubborn", "gpus=1").code == 0
    train, stubborn = world.new_report("train"), world.new_report("stubborn")
    wait_for("the agent to publish both", lambda: world.worker_record("stubborn"))

    os.kill(etcd.pid, signal.SIGSTOP)  # from here on, every store call hangs
    os.kill(train["pid"], signal.SIGKILL)
    again = world.new_report("train", not_pid=train["pid"], timeout=REACT_SECONDS)
    assert again["env"]["ALLOCATOR_GPUS"] == "0"

    world.gpus.update(1, healthy=False)  # stubborn moves to CPU; it ignores SIGTERM
    on_cpu = world.new_report("stubborn", not_pid=stubborn["pid"], timeout=REACT_SECONDS)
    assert on_cpu["env"]["ALLOCATOR_DEVICE"] == "cpu"
    assert not pid_alive(stubborn["pid"]) and not pid_alive(stubborn["child_pid"])
    assert world.events("killed", job="stubborn")

    assert world.process is not None
    world.process.send_signal(signal.SIGTERM)
    assert world.process.wait(REACT_SECONDS) == 0
    assert not pid_alive(again["pid"]) and not pid_alive(on_cpu["pid"])
