"""The stopped worker's lookout: continue it once its client ends, and only then."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from allocator.resident import stopped


def _states(*letters: str | None) -> Iterator[str | None]:
    yield from letters
    while True:
        yield letters[-1]


@pytest.fixture
def kills(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, signum: sent.append((pid, signum)))
    monkeypatch.setattr(stopped, "LOOK_SECONDS", 0.01)
    return sent


def test_a_client_that_ends_while_its_worker_is_stopped_continues_it(
    kills: list[tuple[int, int]],
) -> None:
    client_end, ended = os.pipe()
    os.write(ended, b"x")  # the client's pidfd became readable: it ended
    states = _states("T")
    stopped.watch(4242, client_end, lambda _pid: next(states))
    assert kills == [(4242, signal.SIGCONT)]


def test_a_worker_that_runs_again_ends_the_lookout_untouched(
    kills: list[tuple[int, int]],
) -> None:
    client_end, _alive = os.pipe()
    states = _states("R", "T", "T", "S")  # stopping, stopped, `fg`
    stopped.watch(4242, client_end, lambda _pid: next(states))
    assert kills == []


def test_a_worker_that_is_gone_ends_the_lookout(kills: list[tuple[int, int]]) -> None:
    client_end, _alive = os.pipe()
    stopped.watch(4242, client_end, lambda _pid: None)
    assert kills == []


def test_the_state_of_a_real_process_is_read_from_proc() -> None:
    assert stopped._state(os.getpid()) in ("R", "S")
    assert stopped._state(2**22 + 1) is None


def test_bad_words_are_exit_2() -> None:
    assert stopped.main(["x"]) == 2
    assert stopped.main([]) == 2
