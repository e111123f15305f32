"""Generated store URLs and ``--store``/``--prefix`` values against the real CLI.

Every command run with whatever an operator (or an attacker) can put in a
store URL or a key prefix must:

* exit with a documented code (0, 2, 3, 4, 5, 6: never 1, never a crash);
* when it refuses, say so in exactly one line on stderr;
* never print a password or token, wherever in the URL (or the
  environment) it was;
* leave the stores byte-identical when it refuses (the SQLite file and its
  log hashed, etcd's revision compared), and create no store anywhere.

The CLI runs in-process (``allocator.cli.main``), so thousands of cases fit
in a soak. Hosts are only ever loopback addresses or malformed text: no
case can reach the network.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator.cli import main
from allocator.store import open_store
from tests.e2e.conftest import EXAMPLE_POLICY
from tests.reliability.conftest import Figures, scale
from tests.support.etcd_server import EtcdServer

DOCUMENTED = {0, 2, 3, 4, 5, 6}
PREFIX = "/cli-input"
_SAFE = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_URL_CHARS = _SAFE + "-._~!$&'()*+,;=:@/?#[]%"


@dataclass(frozen=True)
class World:
    """The two real stores the cases may name, and where generated SQLite paths go."""

    etcd: EtcdServer
    sqlite_db: Path
    scratch: Path
    closed_port: int


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    base = tmp_path_factory.mktemp("cli-input")
    server = EtcdServer(base / "etcd")
    server.start()
    # Bound but never listening: connections to it are refused, and no other
    # process can take the port while the cases run.
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    db = base / "real" / "store.db"
    try:
        for url in (server.url, f"sqlite://{db}"):
            with _environment(ALLOCATOR_STORE=url, ALLOCATOR_PREFIX=PREFIX):
                assert _run(["policy", "apply", str(EXAMPLE_POLICY)])[0] == 0
                assert _run(["set", "job=train", "gpus=0", "host=node1"])[0] == 0
        scratch = base / "generated"
        scratch.mkdir()
        yield World(server, db, scratch, closed.getsockname()[1])
    finally:
        closed.close()
        server.stop()


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    """Set (or, with "", unset) variables for one case; restore them after."""
    saved = {name: os.environ.get(name) for name in values}
    for name in [n for n in os.environ if n.startswith(("ALLOCATOR_", "ETCDCTL_", "CONSUL_"))]:
        saved.setdefault(name, os.environ.get(name))
        del os.environ[name]
    os.environ.update({k: v for k, v in values.items() if v})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


# --- what the cases are made of -------------------------------------------------------

secrets = st.text(_SAFE, min_size=6, max_size=12).map(lambda s: f"S3cr3t{s}")
junk = st.text(_URL_CHARS, max_size=12)
# What may stand before a password in a URL's user part ("/", "?", "#" would end it).
user_junk = st.text(_SAFE + "-._~!$&'()*+,;=:%", max_size=12)


@st.composite
def store_urls(draw: st.DrawFn, world: World, secret: str) -> str:
    scheme = draw(
        st.sampled_from(["etcd", "etcds", "consul", "consuls", "sqlite", "memory", "ETCD", "etc"])
        | junk
    )
    userinfo = draw(
        st.sampled_from(["", "root@", f"root:{secret}@", f":{secret}@", f"{secret}@"])
        | user_junk.map(lambda j: f"{j}{secret}@")
    )
    if scheme == "sqlite":
        where = draw(
            st.sampled_from([f"{world.sqlite_db}", f"{world.scratch}/missing/x.db", ""])
            | junk.map(lambda j: f"{world.scratch}/{j}")
        )
    else:
        endpoint = world.etcd.endpoint
        closed = f"127.0.0.1:{world.closed_port}"
        good = [endpoint, closed, f"[::1]:{world.closed_port}", f"{endpoint},{closed}"]
        bad = ["[::1", "127.0.0.1:99999", "127.0.0.1:abc", "", ",", ":"]
        where = draw(st.sampled_from([*good, *bad]))
        where += draw(st.sampled_from(["", "/", "/path"]) | junk.map(lambda j: "/" + j))
    query = draw(
        st.lists(
            st.sampled_from(
                [
                    "timeout=0.5",
                    "timeout=1e308",
                    "timeout=nan",
                    "timeout=-1",
                    f"token={secret}",
                    f"password={secret}",
                    "cacert=/nonexistent/ca.pem",
                    "cert=/nonexistent/c.pem&key=/nonexistent/k.pem",
                    "mode=ro",
                    "mode=rwx",
                ]
            )
            | junk,
            max_size=3,
        )
    )
    tail = ("?" + "&".join(query)) if query else ""
    return f"{scheme}://{userinfo}{where}{tail}" + draw(st.sampled_from(["", "#frag"]))


commands = st.sampled_from(
    [
        ["status"],
        ["get", "job=train"],
        ["set", "job=eval-nightly", "gpus=3", "host=node1"],
        ["release", "job=ghost", "host=node1"],
        ["policy", "show"],
        ["policy", "diff", str(EXAMPLE_POLICY)],
        ["env", "job=train", "host=node1"],
    ]
)
prefixes = st.sampled_from(["", PREFIX, "/elsewhere", "/a/b"]) | junk


def _fingerprint(world: World) -> tuple[str, int]:
    digest = hashlib.sha256()
    for suffix in ("", "-wal"):  # the database and its log (a reader may leave an empty log)
        path = Path(f"{world.sqlite_db}{suffix}")
        digest.update(path.read_bytes() if path.exists() else b"")
        digest.update(b"\0")
    store = open_store(world.etcd.url)
    try:
        revision = store.list("/").revision
    finally:
        store.close()
    return digest.hexdigest(), revision


@pytest.fixture(scope="module")
def cases() -> Iterator[list[int]]:
    """Counts the cases run, for the figures."""
    count = [0]
    yield count
    Figures("test_any_store_url_or_prefix_gets_a_documented_answer_and_leaks_nothing").add(
        "cases", count[0]
    )


@pytest.mark.slow
@given(data=st.data())
@settings(
    max_examples=scale(200, 10_000),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_any_store_url_or_prefix_gets_a_documented_answer_and_leaks_nothing(
    world: World, cases: list[int], data: st.DataObject
) -> None:
    secret = data.draw(secrets, "secret")
    url = data.draw(store_urls(world, secret), "url")
    prefix = data.draw(prefixes, "prefix")
    argv = data.draw(commands, "command")
    by_flag = data.draw(st.booleans(), "url given with --store")
    env = {"ETCDCTL_PASSWORD": secret, "CONSUL_HTTP_TOKEN": secret}
    if by_flag:
        argv = [*argv, "--store", url] + (["--prefix", prefix] if prefix else [])
    else:
        env.update(ALLOCATOR_STORE=url, ALLOCATOR_PREFIX=prefix)
    before = _fingerprint(world)

    with _environment(**env):
        code, out, err = _run(argv)

    assert code in DOCUMENTED, (argv, err)
    assert secret not in out + err, (argv, out, err)
    if code != 0:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("allocator: "), err
        assert "internal error" not in err
        assert _fingerprint(world) == before
        assert list(world.scratch.iterdir()) == []
    for leftover in world.scratch.iterdir():  # a successful write may create a new store
        shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
    cases[0] += 1
