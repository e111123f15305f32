"""The agent's side of systemd's notify protocol, against real datagram sockets."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from allocator.agent.notify import Notifier, notifier_from_environ
from tests.support.notify_socket import NotifySocket


def test_the_variables_leave_the_environment_so_workers_cannot_ping() -> None:
    environ = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "42", "A": "b"}
    notifier = notifier_from_environ(environ, pid=42)
    assert environ == {"A": "b"}
    assert notifier.address == "@x" and notifier.ping_every == 15.0


def test_a_watchdog_meant_for_another_process_is_not_pinged() -> None:
    environ = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "41"}
    assert notifier_from_environ(environ, pid=42).next_ping is None
    assert notifier_from_environ({"WATCHDOG_USEC": "junk"}, pid=42).next_ping is None


def test_ready_status_and_stopping_reach_an_abstract_socket() -> None:
    systemd = NotifySocket()
    notifier = Notifier(systemd.address)
    try:
        notifier.ready("supervising 2 adopted job(s)")
        assert systemd.receive(5) == ["READY=1", "STATUS=supervising 2 adopted job(s)"]
        notifier.stopping()
        assert systemd.receive(5) == ["STOPPING=1", "STATUS=stopping"]
    finally:
        notifier.close()
        systemd.close()


def test_the_watchdog_is_pinged_at_half_its_interval() -> None:
    directory = tempfile.mkdtemp(prefix="n")  # short: socket paths are limited to 108 bytes
    path = str(Path(directory) / "notify")
    systemd = NotifySocket(path)
    notifier = Notifier(path, watchdog_seconds=10.0)
    try:
        sent = []
        for now in (0.0, 1.0, 4.9, 5.0, 9.0, 10.1):
            notifier.ping(now)
            if systemd.receive(0.2) == ["WATCHDOG=1"]:
                sent.append(now)
        assert sent == [0.0, 5.0, 10.1]
        assert notifier.next_ping == 15.1
    finally:
        notifier.close()
        systemd.close()
        os.rmdir(directory)


def test_without_systemd_nothing_is_sent_and_nothing_fails() -> None:
    notifier = notifier_from_environ({})
    assert notifier.send("READY=1") is False
    notifier.ping(0.0)
    notifier.close()
    unheard = Notifier("@no-one-listens-here")
    assert unheard.send("READY=1") is False
    unheard.close()
