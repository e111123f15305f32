"""Workers run as the user their job names; logs are theirs and never written through a link.

The real switches need root (the agent runs as root under the shipped
unit); the tests that need it skip only where the suite does not run as root.
``nobody`` plays the job's user. A non-root agent is this test process
forked and turned into ``nobody``.
"""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from allocator.agent.planning.fingerprint import fingerprint
from allocator.agent.planning.types import DesiredJob, Start
from allocator.agent.processes.supervisor import Supervisor
from allocator.agent.processes.users import RunAsError, identity_env, resolve_run_as
from allocator.errors import PolicyError
from allocator.policy import load_policy
from tests.support import supervision
from tests.support.supervision import DUMMY, Harness, job_spec, poll

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux")
make_harness = supervision.make_harness
h = supervision.h

NOBODY = pwd.getpwnam("nobody")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")


# --- resolving the policy's user and group ----------------------------------------------------


def test_a_job_naming_no_one_runs_as_the_agent() -> None:
    assert resolve_run_as(None, None, job="train") is None
    assert identity_env(None) == {}


@pytest.mark.parametrize("spelled", ["nobody", str(NOBODY.pw_uid)])
def test_a_user_is_resolved_with_its_groups_from_the_user_database(spelled: str) -> None:
    run_as = resolve_run_as(spelled, None, job="train", euid=0, egid=0)
    assert run_as is not None
    assert (run_as.user, run_as.uid, run_as.gid) == ("nobody", NOBODY.pw_uid, NOBODY.pw_gid)
    assert set(run_as.groups) == set(os.getgrouplist("nobody", NOBODY.pw_gid))
    assert identity_env(run_as) == {"HOME": NOBODY.pw_dir, "USER": "nobody", "LOGNAME": "nobody"}


def test_a_group_overrides_the_users_primary_group() -> None:
    daemon = grp.getgrnam("daemon")
    run_as = resolve_run_as("nobody", "daemon", job="train", euid=0, egid=0)
    assert run_as is not None and run_as.gid == daemon.gr_gid
    assert daemon.gr_gid in run_as.groups


@pytest.mark.parametrize(
    ("user", "group", "words"),
    [
        ("no-such-user-x", None, "user 'no-such-user-x' does not exist on this host"),
        ("nobody", "no-such-group-x", "group 'no-such-group-x' does not exist on this host"),
        ("4000000000", None, "user '4000000000' does not exist on this host"),
    ],
)
def test_a_name_the_host_does_not_know_is_one_clear_error(
    user: str, group: str | None, words: str
) -> None:
    with pytest.raises(RunAsError) as caught:
        resolve_run_as(user, group, job="train", euid=0, egid=0)
    assert str(caught.value) == f"job 'train': {words}"


def test_an_agent_that_is_not_root_runs_only_jobs_that_are_its_own() -> None:
    uid, gid = NOBODY.pw_uid, NOBODY.pw_gid
    assert resolve_run_as("nobody", None, job="train", euid=uid, egid=gid) is not None
    with pytest.raises(RunAsError, match="only root may start workers as another user"):
        resolve_run_as("daemon", None, job="train", euid=uid, egid=gid)
    with pytest.raises(RunAsError, match="only root"):
        resolve_run_as(None, "daemon", job="train", euid=uid, egid=gid)


# --- the policy -------------------------------------------------------------------------------


def _policy(**job: Any) -> str:
    return json.dumps({"version": 1, "jobs": {"adhoc": {"command": ["x"], **job}}})


def test_the_policy_carries_a_jobs_user_and_group() -> None:
    job = load_policy(_policy(user="nobody", group="nogroup")).jobs["adhoc"]
    assert (job.user, job.group) == ("nobody", "nogroup")
    assert load_policy(_policy()).jobs["adhoc"].user is None


@pytest.mark.parametrize("user", [None, "root", "0"])
def test_an_adhoc_job_must_name_a_user_other_than_root(user: str | None) -> None:
    fields = {"allow_adhoc_command": True, **({"user": user} if user else {})}
    with pytest.raises(PolicyError, match="must name a non-root user"):
        load_policy(_policy(**fields))
    assert load_policy(_policy(allow_adhoc_command=True, user="nobody")).jobs["adhoc"].user


def test_the_user_is_part_of_the_fingerprint_only_when_set() -> None:
    spec = job_spec(Path("/x"))
    worker = spec.workers[0]
    before = [{"argv": list(worker.argv), "env": dict(worker.env), "cwd": worker.cwd}]
    unchanged = hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()
    assert fingerprint([worker]) == unchanged  # jobs naming no one keep their fingerprint
    assert fingerprint([replace(worker, user="nobody")]) != unchanged


# --- starting workers as the job's user -------------------------------------------------------


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory outside root's private temporary tree that ``nobody`` can write."""
    path = Path(tempfile.mkdtemp(prefix="allocator-users-"))
    path.chmod(0o755)
    # The checkout may sit in a directory nobody cannot enter: the worker script travels.
    shutil.copy(DUMMY, path / Path(DUMMY).name)
    (path / "reports").mkdir()
    os.chown(path / "reports", NOBODY.pw_uid, NOBODY.pw_gid)
    try:
        yield path
    finally:
        supervision.kill_reported(path)
        shutil.rmtree(path, ignore_errors=True)


def _python_for(uid: int, dummy: Path) -> str:
    """An interpreter ``uid`` may run the dummy worker with (this one may be in root's home)."""
    for candidate in (sys.executable, shutil.which("python3") or "", "/usr/bin/python3"):
        if not candidate:
            continue
        try:
            probe = subprocess.run(
                [candidate, dummy, "--help"], user=uid, capture_output=True, check=False
            )
        except OSError:
            continue
        if probe.returncode == 0:
            return candidate
    pytest.skip("no Python interpreter that nobody may run")


def _as_user_spec(h: Harness, out_dir: Path, **fields: Any) -> DesiredJob:
    dummy = out_dir / Path(DUMMY).name
    python = _python_for(NOBODY.pw_uid, dummy)
    argv = (python, str(dummy), "--out", str(out_dir / "reports" / "train.0.json"))
    spec = job_spec(h.tmp, argv=argv)
    return replace(spec, workers=tuple(replace(w, **fields) for w in spec.workers))


@needs_root
def test_a_worker_runs_as_its_jobs_user_with_that_users_groups_and_home(
    h: Harness, shared_dir: Path
) -> None:
    h.sup.apply(Start("train", _as_user_spec(h, shared_dir, user="nobody"), "new"))
    report = poll(lambda: supervision.read_json(shared_dir / "reports" / "train.0.json"), "report")
    assert (report["uid"], report["gid"]) == (NOBODY.pw_uid, NOBODY.pw_gid)
    assert report["groups"] == sorted(set(os.getgrouplist("nobody", NOBODY.pw_gid)))
    env = report["env"]
    assert (env["HOME"], env["USER"], env["LOGNAME"]) == (NOBODY.pw_dir, "nobody", "nobody")
    log = h.tmp / "logs" / "train.log"
    assert log.stat().st_uid == NOBODY.pw_uid  # the job's log belongs to the job's user
    assert os.stat(f"/proc/{report['ppid']}").st_uid == 0  # its shim stays root
    assert [name for name, _ in h.events if name == "worker-started"] == ["worker-started"]


@needs_root
def test_a_user_the_host_does_not_know_is_reported_and_nothing_starts(h: Harness) -> None:
    spec = job_spec(h.tmp)
    spec = replace(spec, workers=tuple(replace(w, user="no-such-user-x") for w in spec.workers))
    h.sup.apply(Start("train", spec, "new"))
    h.tick()
    message = "job 'train': user 'no-such-user-x' does not exist on this host"
    assert [(e.exit_code, e.crash, e.message) for e in h.exits] == [(126, True, message)]
    assert h.sup.records()["train"]["message"] == message  # what `allocator status` shows
    failed = [f for name, f in h.events if name == "worker-start-failed"]
    assert [f["error"] for f in failed] == [message]
    assert h.report("train") is None and not list((h.tmp / "workers").glob("*.status"))


@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
def test_a_log_path_that_leads_elsewhere_is_refused(h: Harness, kind: str) -> None:
    target = h.tmp / "precious"
    target.write_text("keep me\n")
    log = h.tmp / "logs" / "train.log"
    log.parent.mkdir(parents=True)
    (log.symlink_to if kind == "symlink" else log.hardlink_to)(target)
    h.sup.apply(Start("train", job_spec(h.tmp), "new"))
    h.tick()
    words = "it is a symbolic link" if kind == "symlink" else "not a plain file with a single name"
    assert [(e.exit_code, e.crash) for e in h.exits] == [(126, True)]
    assert h.exits[0].message == f"cannot open log {log}: {words}"
    assert target.read_text() == "keep me\n"


def _in_child_as_nobody(work: Callable[[], object]) -> Any:
    """Run ``work`` in a fork of this process that has become ``nobody``; return its result."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.setgroups([])
            os.setgid(NOBODY.pw_gid)
            os.setuid(NOBODY.pw_uid)
            result: object = {"ok": work()}
        except BaseException as exc:
            result = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(write_end, json.dumps(result).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    outcome = json.loads(data)
    assert "error" not in outcome, outcome["error"]
    return outcome["ok"]


@needs_root
def test_an_agent_that_is_not_root_refuses_a_job_naming_another_user(shared_dir: Path) -> None:
    state = shared_dir / "agent"
    state.mkdir()
    os.chown(state, NOBODY.pw_uid, NOBODY.pw_gid)
    spec = job_spec(shared_dir)
    spec = replace(spec, workers=tuple(replace(w, user="daemon") for w in spec.workers))

    def start_as_nobody() -> object:
        events: list[tuple[str, dict[str, Any]]] = []
        sup = Supervisor(
            state / "logs",
            state / "state.json",
            logger=lambda name, fields: events.append((name, fields)),
            cgroups=False,
        )
        sup.apply(Start("train", spec, "new"))
        return {
            "exits": [[e.exit_code, e.crash, e.message] for e in sup.tick()],
            "record": sup.records()["train"]["message"],
            "failed": [f["error"] for name, f in events if name == "worker-start-failed"],
        }

    outcome = _in_child_as_nobody(start_as_nobody)
    message = outcome["record"]
    assert message.startswith("job 'train' runs as user 'daemon' but the agent runs as uid")
    assert "only root may start workers as another user" in message
    assert outcome["exits"] == [[126, True, message]]
    assert outcome["failed"] == [message]
    assert not (shared_dir / "reports" / "train.0.json").exists()
