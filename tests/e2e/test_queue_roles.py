"""docs/queue.md's etcd roles, run verbatim: researchers self-serve, and only for themselves.

A real etcd with authentication on; the recipe's shell block is run as it
is printed (as etcd's root), then a second researcher is added with the
same two lines. Each user works with their own credential.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import EXAMPLE_POLICY, REPO, Result, clean_env, run_cli
from tests.support.etcd_server import EtcdServer
from tests.support.waiting import wait_for

PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret", "ops": "ops-secret"}


def _recipe() -> str:
    """The shell block of docs/queue.md that creates the roles."""
    text = (REPO / "docs" / "queue.md").read_text()
    (block,) = [b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "role add" in b]
    return str(block)


@pytest.fixture
def roles(tmp_path: Path) -> Iterator[EtcdServer]:
    """A real etcd with auth on, the recipe applied, and bob added as alice was."""
    server = EtcdServer(tmp_path / "etcd", auth=True)
    server.start()
    recipe = _recipe()
    bob = "\n".join(line for line in recipe.splitlines() if "alice" in line)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL_")}
    env.update(
        ETCDCTL_API="3",
        ETCDCTL_ENDPOINTS=server.endpoint,
        ETCDCTL_USER=f"root:{server.root_password}",
        ALICE_PASSWORD=PASSWORDS["alice"],
        BOB_PASSWORD=PASSWORDS["bob"],
        OPS_PASSWORD=PASSWORDS["ops"],
    )
    for script in (recipe, bob.replace("alice", "bob").replace("ALICE", "BOB")):
        subprocess.run(["bash", "-euc", script], env=env, check=True, capture_output=True)
    try:
        yield server
    finally:
        server.stop()


def _as(server: EtcdServer, user: str, *args: str) -> Result:
    url = f"etcd://{user}:{PASSWORDS[user]}@{server.endpoint}"
    return run_cli(args, clean_env(ALLOCATOR_STORE=url, ALLOCATOR_HOST="node1"))


def test_the_documented_roles_let_each_researcher_set_run_and_release(
    roles: EtcdServer, tmp_path: Path
) -> None:
    assert _as(roles, "ops", "policy", "apply", str(EXAMPLE_POLICY)).code == 0
    done = _as(roles, "alice", "set", "job=train", "host=node1", "gpus=0")
    assert done.code == 0, done.err
    assert _as(roles, "alice", "release", "job=train").code == 0
    ran = _as(
        roles,
        "bob",
        "run",
        "job=probe",
        "host=node1",
        "count=1",
        "--",
        sys.executable,
        "-c",
        "pass",
    )
    assert ran.code == 0, ran.err
    assert _as(roles, "bob", "status").code == 0
    # Policy stays out of a researcher's reach.
    edited = tmp_path / "policy.yaml"
    edited.write_text(
        EXAMPLE_POLICY.read_text().replace("hold_down_seconds: 10", "hold_down_seconds: 11")
    )
    refused = _as(roles, "alice", "policy", "apply", str(edited))
    assert refused.code == 5, refused.err
    wait_for("nothing held", lambda: _as(roles, "ops", "get", "job=probe").code == 6)


def test_only_the_holder_or_an_operator_may_release_or_reset_a_holding(
    roles: EtcdServer, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        EXAMPLE_POLICY.read_text()
        + "\nteams:\n  vision:\n    members: [alice]\n    operators: [carol]\n"
        + "operators: [user:ops]\n"
    )
    assert _as(roles, "ops", "policy", "apply", str(policy)).code == 0
    assert _as(roles, "alice", "set", "job=train", "host=node1", "gpus=0").code == 0

    for words in (("release", "job=train"), ("set", "job=train", "host=node1", "gpus=1")):
        refused = _as(roles, "bob", *words)
        assert refused.code == 5, refused
        assert refused.err.count("\n") == 1 and "held by alice" in refused.err, refused.err
    assert _as(roles, "alice", "get", "job=train").code == 0  # still alice's, unchanged
    # The holder may; so may the policy's operators (a `set` makes the holding theirs).
    moved = _as(roles, "alice", "set", "job=train", "host=node1", "gpus=1")
    assert moved.code == 0, moved.err
    assert _as(roles, "ops", "release", "job=train").code == 0


def test_a_refusal_names_the_operation_the_key_and_the_user(roles: EtcdServer) -> None:
    assert _as(roles, "ops", "policy", "apply", str(EXAMPLE_POLICY)).code == 0
    roles.etcdctl("role", "add", "reader")
    roles.etcdctl("role", "grant-permission", "reader", "read", "/allocator/", "--prefix=true")
    roles.etcdctl("user", "add", f"carol:{PASSWORDS['alice']}")
    roles.etcdctl("user", "grant-role", "carol", "reader")
    url = f"etcd://carol:{PASSWORDS['alice']}@{roles.endpoint}"
    env = clean_env(ALLOCATOR_STORE=url, ALLOCATOR_DEBUG="1")
    refused = run_cli(["set", "job=train", "host=node1", "gpus=0"], env)
    assert refused.code == 5, refused
    assert refused.err.count("\n") == 1, refused.err
    key = "/allocator/v1/hosts/node1/jobs/train"
    assert f"refused txn put {key} (user carol): grant a role of carol write on {key}" in (
        refused.err
    )
    assert _as(roles, "ops", "get", "job=train").code == 6  # nothing written
