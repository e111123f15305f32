"""The real CLI as a subprocess, against SQLite and a real etcd."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from jsonschema import Draft202012Validator

from allocator.store import Store, open_store

if TYPE_CHECKING:
    from tests.e2e.serve_harness import Served

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_POLICY = REPO / "config" / "policy.example.yaml"
SCHEMAS = REPO / "docs" / "schemas"


@dataclass(frozen=True)
class Result:
    """One finished CLI run."""

    code: int
    out: str
    err: str


Cli = Callable[..., Result]


@pytest.fixture(params=["sqlite", "etcd"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each end-to-end test runs against the embedded store and a real etcd."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'store.db'}"
    server = request.getfixturevalue("etcd_server")
    return str(server.url)  # type: ignore[attr-defined]


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any store settings or credentials, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ALLOCATOR_", "ETCDCTL_", "CONSUL_"))
    }
    env.update(extra)
    return env


@pytest.fixture
def cli_env(store_url: str, prefix: str) -> dict[str, str]:
    """Environment selecting this test's store and key prefix; this machine is node1.

    ``run`` and ``lease()`` take GPUs of this machine only: the example
    policy's ``node1`` stands for it.
    """
    return clean_env(ALLOCATOR_STORE=store_url, ALLOCATOR_PREFIX=prefix, ALLOCATOR_HOST="node1")


def run_cli(args: Sequence[str], env: dict[str, str], timeout: float = 60) -> Result:
    """Run ``python -m allocator ARGS`` and capture everything."""
    proc = subprocess.run(
        [sys.executable, "-m", "allocator", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def cli(cli_env: dict[str, str]) -> Cli:
    """Run the CLI against this test's store."""

    def call(*args: str, env: dict[str, str] | None = None) -> Result:
        return run_cli(args, {**cli_env, **(env or {})})

    return call


@pytest.fixture
def applied(cli: Cli) -> Cli:
    """The CLI, with the example policy already applied."""
    result = cli("policy", "apply", str(EXAMPLE_POLICY))
    assert result.code == 0, result.err
    return cli


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """This test's store, opened beside the CLI's processes."""
    opened = open_store(store_url)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def served(store_url: str, prefix: str, tmp_path: Path) -> Iterator[Served]:
    """``allocator serve`` reading this test's store, the example policy applied."""
    from tests.e2e.serve_harness import Served

    world = Served(store_url, prefix, tmp_path)
    try:
        yield world
    finally:
        world.close()


def schema(name: str) -> Draft202012Validator:
    """The JSON schema ``docs/schemas/NAME.schema.json`` of an ``-o json`` document."""
    return Draft202012Validator(json.loads((SCHEMAS / f"{name}.schema.json").read_text()))


def history_entries(cli: Cli, *words: str) -> list[dict[str, Any]]:
    """``history WORDS -o json``'s entries, the document checked against its schema."""
    result = cli("history", *words, "-o", "json")
    assert result.code == 0, result.err
    document = json.loads(result.out)
    assert list(schema("history").iter_errors(document)) == []
    entries: list[dict[str, Any]] = document["entries"]
    return entries
