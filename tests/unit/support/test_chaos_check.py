"""The fault run's checker finds each violation in hand-made records, and none where none is."""

from __future__ import annotations

from typing import Any

from tests.support.chaos_check import (
    Ack,
    Change,
    ClientOp,
    Span,
    assignments_unserved,
    changes_from_history,
    duplicate_workers,
    holdings_held_twice,
    jobs_run_twice,
    spans_from_journal,
    workers_held_twice,
    workers_lost,
)


def _entry(revision: int, action: str, job: str, to: list[str] | None) -> dict[str, Any]:
    return {
        "revision": revision,
        "action": action,
        "host": "h",
        "job": job,
        "to": None if to is None else {"gpus": to, "mode": "gpu"},
    }


# --- history replay -----------------------------------------------------------------


def test_history_entries_become_holding_changes_in_revision_order() -> None:
    entries = [
        _entry(5, "release", "a", None),
        _entry(3, "move", "a", ["2"]),
        _entry(2, "set", "a", ["0", "1"]),
        {"revision": 1, "action": "policy-apply", "host": None, "job": None, "to": None},
        _entry(4, "fallback", "a", None),  # an agent's own note changes no holding
    ]
    assert changes_from_history(entries) == [
        Change(2, "set", "h", "a", (0, 1)),
        Change(3, "move", "h", "a", (2,)),
        Change(5, "release", "h", "a", ()),
    ]


def test_a_gpu_given_while_another_job_holds_it_is_held_twice() -> None:
    changes = [Change(2, "set", "h", "a", (0,)), Change(3, "set", "h", "b", (0, 1))]
    (found,) = holdings_held_twice(changes)
    assert found.prop == "gpu-held-twice"
    assert "revision 3" in found.detail and "GPU 0" in found.detail and "a held it" in found.detail


def test_gpus_freed_by_a_release_an_expiry_or_a_move_may_be_given_again() -> None:
    changes = [
        Change(2, "set", "h", "a", (0,)),
        Change(3, "release", "h", "a", ()),
        Change(4, "set", "h", "b", (0,)),
        Change(5, "expired", "h", "b", ()),
        Change(6, "set", "h", "c", (0,)),
        Change(7, "move", "h", "c", (1,)),
        Change(8, "set", "h", "d", (0,)),
        Change(9, "set", "other", "e", (1,)),  # another host's GPU 1 is another GPU
    ]
    assert holdings_held_twice(list(reversed(changes))) == []  # replayed by revision


# --- workers on GPUs ----------------------------------------------------------------


def _span(pid: int, job: str, start: float, end: float | None, **kw: Any) -> Span:
    return Span(pid, kw.pop("host", "h"), job, kw.pop("gpus", (0,)), start, end, **kw)


def test_workers_of_two_jobs_overlapping_on_one_gpu_hold_it_twice() -> None:
    spans = [_span(1, "a", 0.0, 2.0), _span(2, "b", 1.5, 3.0, gpus=(1, 0))]
    (found,) = workers_held_twice(spans, until=10.0)
    assert "GPU 0 of h" in found.detail and "PID 1" in found.detail and "PID 2" in found.detail


def test_a_worker_still_running_at_the_end_overlaps_until_then() -> None:
    spans = [_span(1, "a", 0.0, None), _span(2, "b", 5.0, 6.0)]
    assert len(workers_held_twice(spans, until=10.0)) == 1
    assert workers_held_twice(spans, until=4.0) == []


def test_one_after_the_other_or_on_other_gpus_is_no_violation() -> None:
    spans = [
        _span(1, "a", 0.0, 2.0),
        _span(2, "b", 2.0, 3.0),  # starts as the other ends
        _span(3, "c", 0.0, 3.0, gpus=(1,)),
        _span(4, "d", 0.0, 3.0, host="other"),
    ]
    assert workers_held_twice(spans, until=10.0) == []


def test_two_workers_of_one_job_at_once_are_duplicates() -> None:
    spans = [_span(1, "a", 0.0, 2.0), _span(2, "a", 1.0, 3.0, gpus=(1,))]
    (found,) = duplicate_workers(spans, until=10.0)
    assert found.prop == "duplicate-worker" and "a@h" in found.detail
    assert duplicate_workers([_span(1, "a", 0.0, 1.0), _span(2, "a", 1.0, 2.0)], 10.0) == []
    assert duplicate_workers([_span(1, "a", 0.0, 2.0), _span(2, "a", 1.0, 2.0, host="x")], 9) == []


# --- finished jobs ------------------------------------------------------------------


def _set(invoke: float, complete: float | None, code: int | None = 0) -> ClientOp:
    return ClientOp("set", "h", "a", invoke, complete, code)


def test_a_finished_job_started_again_with_no_set_since_ran_twice() -> None:
    spans = [_span(1, "a", 1.0, 2.0, finished=True), _span(2, "a", 3.0, None)]
    ops = [_set(0.0, 0.5), _set(0.6, 1.9)]  # both returned before the finish
    (found,) = jobs_run_twice(spans, ops)
    assert found.prop == "job-run-twice" and "PID 2" in found.detail


def test_a_set_that_may_have_been_written_after_the_finish_allows_the_new_start() -> None:
    spans = [_span(1, "a", 1.0, 2.0, finished=True), _span(2, "a", 3.0, None)]
    assert jobs_run_twice(spans, [_set(1.5, 2.5)]) == []  # returned after the finish
    assert jobs_run_twice(spans, [_set(1.5, None, None)]) == []  # never returned
    assert jobs_run_twice(spans, [_set(1.5, 2.5, 4)]) == []  # store unreachable: maybe written


def test_a_refused_set_or_one_after_the_start_allows_nothing() -> None:
    spans = [_span(1, "a", 1.0, 2.0, finished=True), _span(2, "a", 3.0, None)]
    assert len(jobs_run_twice(spans, [_set(1.5, 2.5, 3)])) == 1  # conflict: nothing written
    assert len(jobs_run_twice(spans, [_set(3.5, 4.0)])) == 1  # came after the start
    other = ClientOp("set", "h", "b", 1.5, 2.5, 0)
    assert len(jobs_run_twice(spans, [other])) == 1  # another job's set


def test_a_stopped_worker_may_start_again_and_a_run_command_runs_once() -> None:
    stopped = [_span(1, "a", 1.0, 2.0), _span(2, "a", 3.0, None)]
    assert jobs_run_twice(stopped, []) == []  # not finished: a restart is the agent's job
    run = ClientOp("run", "h", "r1", 0.0, 9.0, 0)
    twice = [_span(1, "r1", 1.0, 2.0, finished=True), _span(2, "r1", 3.0, 4.0)]
    assert len(jobs_run_twice(twice, [run])) == 1  # run's own holding is no new set


# --- acknowledged workers -----------------------------------------------------------


def test_a_pid_acknowledged_for_a_while_that_never_started_is_lost() -> None:
    acks = [Ack(0.0, "h", "a", "running", (7,)), Ack(1.5, "h", "a", "running", (7,))]
    (found,) = workers_lost(acks, [_span(8, "a", 0.0, None)], settle=1.0)
    assert found.prop == "worker-lost" and "PID 7" in found.detail


def test_an_acknowledged_worker_that_started_or_a_fleeting_one_is_not_lost() -> None:
    acks = [Ack(0.0, "h", "a", "running", (7,)), Ack(1.5, "h", "a", "running", (7,))]
    assert workers_lost(acks, [_span(7, "a", 0.0, 1.0)], settle=1.0) == []
    brief = [Ack(0.0, "h", "a", "running", (9,)), Ack(0.5, "h", "a", "running", (9,))]
    assert workers_lost(brief, [], settle=1.0) == []
    stopping = [Ack(0.0, "h", "a", "stopped", (9,)), Ack(5.0, "h", "a", "stopped", (9,))]
    assert workers_lost(stopping, [], settle=1.0) == []


def test_an_assignment_with_no_live_worker_on_its_gpus_is_unserved() -> None:
    assigned = {("h", "a"): (0,), ("h", "b"): (1, 2)}
    spans = [
        _span(1, "a", 0.0, None),
        _span(2, "b", 0.0, 1.0, gpus=(1, 2)),  # ended
        _span(3, "b", 1.0, None, gpus=(1,)),  # live, on other GPUs
    ]
    (found,) = assignments_unserved(assigned, spans)
    assert found.prop == "worker-lost" and "b@h holds GPUs 1,2" in found.detail
    assert "PID 3" in found.detail
    spans.append(_span(4, "b", 2.0, None, gpus=(1, 2)))
    assert assignments_unserved(assigned, spans) == []


# --- the journal --------------------------------------------------------------------


def test_journal_lines_become_spans_ended_by_their_end_line_or_seen_gone() -> None:
    lines = [
        {"event": "start", "pid": 1, "job": "a", "host": "h", "gpus": [0], "time": 1.0},
        {"event": "start", "pid": 2, "job": "b", "host": "h", "gpus": [1], "time": 2.0},
        {"event": "start", "pid": 3, "job": "c", "host": "h", "gpus": [], "time": 3.0},
        {"event": "end", "pid": 1, "how": "exit", "time": 4.0},
        {"event": "end", "pid": 2, "how": "sigterm", "time": 5.0},
    ]
    assert spans_from_journal(lines, {3: 6.0}) == [
        Span(1, "h", "a", (0,), 1.0, 4.0, finished=True),
        Span(2, "h", "b", (1,), 2.0, 5.0, finished=False),
        Span(3, "h", "c", (), 3.0, 6.0, finished=False),
    ]
    assert spans_from_journal(lines[2:3])[0].end is None
