"""A job across hosts ends as all its shares say: a finished share's judgement (pure)."""

from __future__ import annotations

from allocator.agent.planning.across_hosts import PeerHost, PeerShare
from allocator.agent.planning.whole_job_end import (
    agents_gone_since,
    shares_unreported_since,
    whole_job_end,
)
from allocator.records.types import Assignment, WorkerRecord

NODES = ("node1", "node2", "node3")
REVISION = 7
OWN = "finished (exit 0); its GPUs released (release_on_exit)"
GRACE = 30.0


def share(host: str) -> Assignment:
    return Assignment(
        job="train", host=host, gpus=(0,), mode="gpu", updated_by="ops", updated_at="t",
        nodes=NODES, master_port=29500,
    )  # fmt: skip


def peer(
    host: str,
    state: str = "running",
    *,
    last_exit: int | None = None,
    crash_restarts: int = 0,
    alive: bool = True,
    revision: int = REVISION,
) -> PeerHost:
    worker = WorkerRecord(
        job="train", host=host, state=state, last_exit=last_exit,
        crash_restarts=crash_restarts, assignment_revision=revision,
    )  # fmt: skip
    return PeerHost(host, True, alive, None, {"train": PeerShare(share(host), REVISION, worker)})


def judge(
    peers: dict[str, PeerHost],
    gone_for: dict[str, float] | None = None,
    quiet: dict[str, float] | None = None,
) -> tuple[bool, str]:
    end = whole_job_end(share("node1"), OWN, (0,), peers, gone_for or {}, GRACE, 0, quiet)
    assert end.failed == end.reason.endswith("GPUs kept")  # a result, not a wait
    return end.release, end.reason


def test_the_job_is_released_once_every_share_finished_well() -> None:
    peers = {"node2": peer("node2", "finished", last_exit=0), "node3": peer("node3", "running")}
    assert judge(peers) == (
        False,
        "finished (exit 0); the job's GPUs go once every share ends (node3's share (running))",
    )
    peers["node3"] = peer("node3", "finished", last_exit=0, crash_restarts=2)
    assert judge(peers) == (True, f"{OWN}; node3's share finished after 2 crash restarts")


def test_a_share_crashed_and_awaiting_its_restart_has_not_ended() -> None:
    for state in ("crashed", "backoff", "exited", "stopping", "waiting"):
        assert judge({"node2": peer("node2", state, last_exit=1)})[0] is False


def test_a_crash_anywhere_is_the_jobs_result_and_nothing_is_released() -> None:
    ended = {"node2": peer("node2", "finished", last_exit=1), "node3": peer("node3", "running")}
    assert judge(ended) == (
        False,
        "finished (exit 0); node2's share ended with exit 1: that is the job's result; GPUs kept",
    )
    assert judge({"node2": peer("node2", "gave-up", last_exit=1)})[1].startswith(
        "finished (exit 0); node2's share gave up"
    )


def test_a_dead_peers_share_is_judged_by_its_agents_liveness_after_the_grace() -> None:
    dead = {"node2": peer("node2", "running", alive=False)}
    assert judge(dead, {"node2": GRACE - 1}) == (
        False,
        "finished (exit 0); the job's GPUs go once every share ends (node2's agent, gone for 29s)",
    )
    assert judge(dead, {"node2": GRACE}) == (
        True,
        f"{OWN}; node2's agent is gone (30s): its share's end is unknown",
    )
    # What a dead agent's share said last, when it had ended, still counts.
    assert judge({"node2": peer("node2", "finished", last_exit=3, alive=False)})[0] is False


def test_a_share_its_live_agent_has_not_reported_on_yet_is_starting_until_the_grace() -> None:
    # Both agents saw the assignment at once; this share ended before the other's first
    # report (a report on the older assignment, or none): releasing now would stop it.
    stale = peer("node2", "running", revision=REVISION - 1)
    none = PeerHost("node2", True, True, None, {})
    waits = "finished (exit 0); the job's GPUs go once every share ends (node2's share (starting))"
    for unreported in (stale, none):
        assert judge({"node2": unreported}) == (False, waits)
        assert judge({"node2": unreported}, quiet={"node2": GRACE - 1}) == (False, waits)
        assert judge({"node2": unreported}, quiet={"node2": GRACE}) == (
            True,
            f"{OWN}; node2's share never reported (30s): its end is unknown",
        )


def test_what_is_not_known_holds_nothing_up() -> None:
    assert judge({"node2": PeerHost("node2", readable=False)}) == (True, OWN)
    assert judge({}) == (True, OWN)


def test_a_share_is_unreported_since_its_live_agent_was_first_seen_without_a_report() -> None:
    held = {"train": share("node1")}
    peers = {"node2": peer("node2", revision=REVISION - 1), "node3": peer("node3")}
    first = shares_unreported_since({}, held, peers, 100.0)
    assert first == {("node2", "train"): 100.0}  # node3 reports on this assignment
    assert shares_unreported_since(first, held, peers, 130.0) == {("node2", "train"): 100.0}
    peers["node2"] = peer("node2")  # its first report came
    assert shares_unreported_since(first, held, peers, 131.0) == {}
    peers["node2"] = peer("node2", revision=REVISION - 1, alive=False)  # gone: that rule
    assert shares_unreported_since({}, held, peers, 132.0) == {}


def test_a_peers_agent_is_gone_since_it_was_first_seen_gone() -> None:
    gone = {"node2": peer("node2", alive=False), "node3": peer("node3")}
    first = agents_gone_since({}, gone, 100.0)
    assert first == {"node2": 100.0}
    assert agents_gone_since(first, gone, 130.0) == {"node2": 100.0}
    assert agents_gone_since(first, {"node2": peer("node2")}, 131.0) == {}  # back
