"""Submissions on etcd with docs/queue.md's roles (run verbatim): a name is proven, not claimed.

Each researcher's submissions lie under their own prefix, which only their
own role may write. A user without that credential cannot write another
user's record; a queue entry naming that user (which any ``allocator-user``
may write) then points to nothing, and the host's agent refuses it: it
never runs, whatever it names.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from allocator.errors import PermissionDenied
from allocator.records.holders import QueueEntry
from allocator.records.submission import Submission
from allocator.store import Put, open_store
from tests.e2e.agent_harness import HOST, AgentHarness, agent_policy
from tests.e2e.conftest import run_cli
from tests.e2e.test_queue_roles import PASSWORDS, _recipe, roles
from tests.support.etcd_server import EtcdServer
from tests.support.waiting import wait_for

__all__ = ["roles"]  # the fixture, shared with the roles' own tests

STAMP = "2026-12-05T00:00:00Z"


def _url(server: EtcdServer, user: str) -> str:
    return f"etcd://{user}:{PASSWORDS[user]}@{server.endpoint}"


@pytest.fixture
def world(roles: EtcdServer, tmp_path: Path) -> Iterator[AgentHarness]:
    """The agent with an operator's credential, the policy applied by that operator."""
    harness = AgentHarness(tmp_path, _url(roles, "ops"), "/allocator", gpus=2)
    with harness.running(policy=agent_policy(tmp_path, gpus=2)):
        yield harness


def test_alice_may_submit_under_her_own_prefix(world: AgentHarness, roles: EtcdServer) -> None:
    env = {**world.env, "ALLOCATOR_STORE": _url(roles, "alice")}
    done = run_cli(["submit", "job=mine", "count=1", f"host={HOST}", "--", "true"], env)
    assert done.code == 0, done.err
    assert done.out.split() == ["mine"]


def test_a_submission_in_another_users_name_never_runs(
    world: AgentHarness, roles: EtcdServer
) -> None:
    marker = world.workdir / "forged.ran"
    record = Submission(
        job="forged", user="alice", host=HOST, argv=("touch", str(marker)),
        cwd=str(world.workdir), submitted_at=STAMP, count=1,
    )  # fmt: skip
    entry = QueueEntry(
        job="forged", host=HOST, holder="alice", since=STAMP, count=1,
        requested="count=1", self_service=True, submission="alice/forged",
    )  # fmt: skip
    bob = open_store(_url(roles, "bob"))
    try:
        # bob's credential cannot write under alice's prefix ...
        with pytest.raises(PermissionDenied):
            bob.txn([], [Put(world.layout.submission("alice", "forged"), record.to_json())])
        # ... but may write the host's queue: an entry naming alice, pointing to nothing.
        bob.txn([], [Put(world.layout.queue_entry(HOST, "forgedbybob"), entry.to_json())])
    finally:
        bob.close()
    refused = wait_for("the agent's refusal", lambda: world.events("batch-refused", job="forged"))
    assert "no submission record alice/forged" in refused[0]["reason"]
    assert not marker.exists()
    assert world.cli("get", "job=forged").code == 6
    assert "forged" in world.cli("queue").out  # left for the operator


def _nobody_known() -> bool:
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        return False
    return True


@pytest.mark.skipif(
    os.geteuid() != 0 or not _nobody_known(), reason="starting a job as another user needs root"
)
def test_a_root_agent_runs_a_proven_submission_as_its_user(
    world: AgentHarness, roles: EtcdServer
) -> None:
    # The recipe's lines for alice, for an etcd user named as the host's user `nobody`.
    for line in _recipe().splitlines():
        if "alice" in line and line.startswith("etcdctl"):
            words = line.replace("alice", "nobody").split()[1:]
            words = [f"--new-user-password={PASSWORDS['alice']}" if "PASSWORD" in w else w
                     for w in words]  # fmt: skip
            roles.etcdctl(*words)
    env = {**world.env, "ALLOCATOR_STORE": f"etcd://nobody:{PASSWORDS['alice']}@{roles.endpoint}"}
    victim = world.workdir / "root-owned"
    victim.write_text("root's\n")
    for job, output in (("who", ()), ("evil", (f"output={victim}",))):
        done = subprocess.run(
            [sys.executable, "-m", "allocator", "submit", f"job={job}", "count=1",
             f"host={HOST}", *output, "--", "/usr/bin/id", "-u"],
            env=env, cwd="/", capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    wait_for("the job's end", lambda: world.events("batch-ended", job="who"), timeout=30)
    out = world.workdir / "agent" / "logs" / "submit" / "who.log"
    nobody = pwd.getpwnam("nobody").pw_uid
    assert out.read_text().strip() == str(nobody)
    assert out.stat().st_uid == nobody
    # A path the user chose is never opened with the agent's rights: root's file is untouched.
    refused = wait_for("evil refused", lambda: world.events("batch-not-started", job="evil"))
    assert "is not a file of nobody's" in refused[0]["error"]
    assert victim.read_text() == "root's\n"
