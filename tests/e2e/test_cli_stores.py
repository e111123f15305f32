"""The CLI's store-facing answers: not found, missing stores, read-only users, secrets,
bad records."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from allocator.records.keys import KeyLayout
from allocator.store import open_store
from tests.e2e.conftest import EXAMPLE_POLICY, Cli, Result, clean_env, run_cli
from tests.support.waiting import wait_for

SECRET = "hunter2-but-longer"


def _one_line(result: Result) -> str:
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert "Traceback" not in result.err
    return lines[0]


# --- 9.10: "not found" is exit 6, one message shape ---------------------------------


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (("get", "job=ghost"), "on any host"),
        (("get", "job=ghost", "host=node1"), "on host 'node1'"),
        (("env", "job=ghost"), "on any host"),
        (("env", "job=ghost", "host=node1"), "on host 'node1'"),
        (("release", "job=ghost"), "on any host"),
        (("release", "job=ghost", "host=node1"), "on host 'node1'"),
    ],
)
def test_a_job_that_holds_nothing_is_not_found_exit_6_in_every_command(
    applied: Cli, args: tuple[str, ...], where: str
) -> None:
    result = applied(*args)

    assert result.code == 6, result.err
    line = _one_line(result)
    assert line.startswith(f"allocator: not found: job 'ghost' holds nothing {where}")


def test_not_found_names_the_jobs_the_host_does_hold(applied: Cli) -> None:
    assert applied("set", "job=train", "gpus=0", "host=node1").code == 0
    result = applied("get", "job=trian", "host=node1")
    assert result.code == 6 and "(jobs there: train)" in result.err


def test_policy_show_with_nothing_applied_is_not_found(cli: Cli, store_url: str) -> None:
    if store_url.startswith("sqlite://"):
        open_store(store_url).put("/unrelated", b"x")  # the store exists, with no policy
    result = cli("policy", "show")
    assert result.code == 6, result.err
    assert "no policy applied" in _one_line(result)


# --- 13.6: reads never create a store -----------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("status",),
        ("get", "job=train"),
        ("release", "job=train"),
        ("set", "job=train", "gpus=0"),
        ("policy", "show"),
        ("policy", "diff", str(EXAMPLE_POLICY)),
        ("env", "job=train"),
    ],
)
def test_a_command_on_a_missing_sqlite_store_is_exit_4_and_creates_nothing(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    missing = tmp_path / "typo" / "x.db"

    result = run_cli(args, clean_env(ALLOCATOR_STORE=f"sqlite://{missing}"))

    assert result.code == 4, result.err
    assert str(missing) in _one_line(result) and "does not exist" in result.err
    assert list(tmp_path.iterdir()) == []


def test_a_failing_apply_leaves_no_store_behind_and_a_good_one_creates_it(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nhosts: {node1: {gpus: many}}\n")
    db = tmp_path / "state" / "x.db"
    env = clean_env(ALLOCATOR_STORE=f"sqlite://{db}")

    refused = run_cli(["policy", "apply", str(bad)], env)

    assert refused.code == 2, refused.err
    assert not (tmp_path / "state").exists()
    assert run_cli(["policy", "apply", str(EXAMPLE_POLICY)], env).code == 0
    assert db.is_file()


# --- 9.6: reads work for a user who may only read the store --------------------------

_CRASHING_AGENT = """
import os, signal, sys
from allocator.store.sqlite.store import SqliteStore
store = SqliteStore(sys.argv[1])
lease = store.grant_lease(0.5)
store.put(sys.argv[2], b"{}", lease=lease)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _as_reader(args: list[str], env: dict[str, str]) -> Result:
    """Run the CLI as a user who may read the store but not write it.

    As root, as root without any capability (util-linux's ``setpriv``), so the
    read-only file modes bind it like anyone else (it can still read the
    checkout, which ``nobody`` may not); as anyone else, as themselves.
    """
    prefix: list[str] = []
    if os.geteuid() == 0:
        prefix = ["setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all"]
    proc = subprocess.run(
        [*prefix, sys.executable, "-m", "allocator", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd="/",
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory others may read but not write (pytest's own temp root is private)."""
    path = Path(tempfile.mkdtemp(prefix="allocator-ro-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("crashed", [True, False], ids=["after-an-agent-crash", "after-clean-exit"])
def test_a_read_only_user_can_read_a_store_whose_agent_lease_expired(
    shared_dir: Path, crashed: bool
) -> None:
    db = shared_dir / "store.db"
    env = clean_env(ALLOCATOR_STORE=f"sqlite://{db}", ALLOCATOR_PREFIX="/allocator")
    assert run_cli(["policy", "apply", str(EXAMPLE_POLICY)], env).code == 0
    agent_key = KeyLayout("/allocator").agent("node1")
    if crashed:
        child = subprocess.run(
            [sys.executable, "-c", _CRASHING_AGENT, str(db), agent_key], check=False
        )
        assert child.returncode == -9
    else:
        store = open_store(f"sqlite://{db}")
        store.put(agent_key, b"{}", lease=store.grant_lease(0.5))
        store.close()
    for path in shared_dir.iterdir():
        path.chmod(0o444)
    shared_dir.chmod(0o555)
    expired_at = time.time() + 0.6
    wait_for("the agent's lease to expire", lambda: time.time() > expired_at)
    before = {p.name: p.read_bytes() for p in shared_dir.iterdir()}

    status = _as_reader(["status", "-o", "json"], env)

    assert status.code == 0, status.err
    assert {h["host"] for h in json.loads(status.out)["hosts"]} >= {"node1"}
    assert {p.name: p.read_bytes() for p in shared_dir.iterdir()} == before  # nothing written


# --- 9.7 / 9.8: URLs: malformed input is exit 2, and no secret is ever echoed ---------


@pytest.mark.parametrize(
    "url",
    [
        f"etc://root:{SECRET}@127.0.0.1:2379",
        f"etcd://root:{SECRET}@[::1",
        f"etcd://root:{SECRET}@127.0.0.1:2379?timeout=1e308",
        f"etcd://root:{SECRET}@127.0.0.1:2379?cacert=/etc/ca.pem",
        f"etcd://root:{SECRET}/x?y@127.0.0.1:2379",  # a raw "/" in the password
        f"consul://root:{SECRET}@127.0.0.1:8500",
        f"consul://127.0.0.1:8500/?token={SECRET}",
    ],
)
def test_a_bad_store_url_is_exit_2_in_one_line_that_holds_no_secret(url: str) -> None:
    result = run_cli(["status"], clean_env(ALLOCATOR_STORE=url))

    assert result.code == 2, result.err
    line = _one_line(result)
    assert SECRET not in result.err + result.out
    assert line.startswith("allocator: error: ")


def test_sqlite_mode_ro_is_an_option_not_part_of_the_file_name(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    env = clean_env(ALLOCATOR_STORE=f"sqlite://{db}")
    assert run_cli(["policy", "apply", str(EXAMPLE_POLICY)], env).code == 0

    read = run_cli(
        ["status"], clean_env(ALLOCATOR_STORE=f"sqlite://{db}?mode=ro")
    )  # no "x.db?mode=ro"
    read_only = clean_env(ALLOCATOR_STORE=f"sqlite://{db}?mode=ro")
    write = run_cli(["set", "job=train", "gpus=0", "host=node1"], read_only)

    assert read.code == 0, read.err
    assert write.code == 5 and "mode=ro" in _one_line(write)
    assert [p.name for p in tmp_path.iterdir() if "?" in p.name or "mode" in p.name] == []


def test_a_refused_etcd_password_is_never_printed(etcd_auth_url: str) -> None:
    wrong = etcd_auth_url.replace(":root-secret@", f":{SECRET}@")

    result = run_cli(["status"], clean_env(ALLOCATOR_STORE=wrong))

    assert result.code == 5, result.err
    assert SECRET not in result.err + result.out and "root-secret" not in result.err


@pytest.fixture(scope="module")
def etcd_auth_url(tmp_path_factory: pytest.TempPathFactory) -> object:
    from tests.support.etcd_server import EtcdServer

    server = EtcdServer(tmp_path_factory.mktemp("etcd-auth"), auth=True)
    server.start()
    try:
        yield f"etcd://root:{server.root_password}@{server.endpoint}"
    finally:
        server.stop()


# --- 9.3: one bad record takes no command down ----------------------------------------


def test_every_command_skips_bad_records_and_release_clears_one(
    applied: Cli, store_url: str, prefix: str
) -> None:
    assert applied("set", "job=eval-nightly", "gpus=3", "host=node1").code == 0
    layout = KeyLayout(prefix)
    store = open_store(store_url)
    try:
        store.put(layout.assignment("node1", "train"), b"\x00 not json")
        store.put(layout.workers("node1", "eval-nightly"), b'{"schema_version": 1, "job": 7}')
        store.put(layout.agent("node2"), b"[]")
    finally:
        store.close()

    for args in (
        ("env", "job=eval-nightly", "-o", "json"),
        ("policy", "diff", str(EXAMPLE_POLICY)),
        ("doctor", "host=node2", "--no-torch"),
        ("get", "job=eval-nightly"),
        ("status",),
    ):
        result = applied(*args)
        assert result.code in (0, 3), (args, result.err)
        assert "Traceback" not in result.err and "internal error" not in result.err

    released = applied("release", "job=train", "host=node1")
    assert released.code == 0, released.err
    assert "damaged" in released.out
    assert applied("get", "job=train", "host=node1").code == 6
    again = applied("policy", "apply", str(EXAMPLE_POLICY).replace("example", "example"))
    assert again.code == 0, again.err
