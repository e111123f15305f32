"""Who a submitted job runs as is proven by the store, never claimed by its entry."""

from __future__ import annotations

import pytest

from allocator.cli.submit import parse_array
from allocator.errors import InvalidInput
from allocator.recipes.submit.enqueue import task_names
from allocator.recipes.submit.proof import Runner, refusal
from allocator.records.holders import QueueEntry
from allocator.records.submission import Submission

STAMP = "2026-12-05T00:00:00Z"


def entry(holder: str = "alice", pointer: str = "alice/train", job: str = "train") -> QueueEntry:
    return QueueEntry(
        job=job, host="node1", holder=holder, since=STAMP, count=1, submission=pointer
    )


def record(user: str = "alice", job: str = "train", host: str = "node1") -> Submission:
    return Submission(
        job=job, user=user, host=host, argv=("true",), cwd="/", submitted_at=STAMP, count=1
    )


AS_ALICE = Runner(user="alice", is_root=False, names_proven=False)


def test_the_agents_own_users_job_runs() -> None:
    assert refusal(entry(), record(), AS_ALICE) is None


@pytest.mark.parametrize(
    ("queued", "stored", "says"),
    [
        (entry(pointer="alice"), record(), "is not <user>/<job>"),
        (entry(), None, "no submission record alice/train"),
        (entry(holder="bob"), record(), "names holder 'bob'"),
        (entry(), record(user="bob"), "names 'bob'"),
        (entry(), record(host="node2"), "on 'node2'"),
        (entry(job="other"), record(), "for job 'train'"),
    ],
)
def test_an_entry_its_record_does_not_prove_is_refused(
    queued: QueueEntry, stored: Submission | None, says: str
) -> None:
    why = refusal(queued, stored, AS_ALICE)
    assert why is not None and says in why


def test_another_users_job_runs_only_where_the_store_proves_names_and_the_agent_is_root() -> None:
    bobs = entry(holder="bob", pointer="bob/train"), record(user="bob")
    unproven = refusal(*bobs, Runner(user="root", is_root=True, names_proven=False))
    assert unproven is not None and "proves no user's name" in unproven
    not_root = refusal(*bobs, Runner(user="alice", is_root=False, names_proven=True))
    assert not_root is not None and "not root" in not_root
    assert refusal(*bobs, Runner(user="root", is_root=True, names_proven=True)) is None


def test_never_as_root_unless_the_policy_names_root() -> None:
    roots = entry(holder="root", pointer="root/train"), record(user="root")
    agent = Runner(user="root", is_root=True, names_proven=True)
    why = refusal(*roots, agent)
    assert why is not None and "never as root" in why
    allowed = Runner(user="root", is_root=True, names_proven=True, root_allowed=("root",))
    assert refusal(*roots, allowed) is None


def test_an_array_names_one_task_per_index() -> None:
    assert task_names("job", None) == [("job", None)]
    assert task_names("arr", parse_array("2-4")) == [("arr-2", 2), ("arr-3", 3), ("arr-4", 4)]


@pytest.mark.parametrize("raw", ["3", "3-1", "a-b", "0-1000", "-1-2"])
def test_a_bad_array_is_invalid_input(raw: str) -> None:
    with pytest.raises(InvalidInput):
        parse_array(raw)
