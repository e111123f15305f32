"""The etcd roles docs/ci.md grants are enough for what each CI step does, as written."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.etcd_server import EtcdServer

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "ci.md"
EXAMPLE = REPO / "config" / "policy.example.yaml"
PASSWORD = "ci-pw-7"


def _recipe() -> list[list[str]]:
    """The ``etcdctl`` lines of the credentials recipe, a password given where it asks."""
    commands = []
    for line in re.findall(r"^etcdctl .*$", DOC.read_text(), re.MULTILINE):
        words = shlex.split(line, comments=True)[1:]
        if words[:2] == ["user", "add"]:
            words[2] += f":{PASSWORD}"
        commands.append(words)
    return commands


@pytest.fixture(scope="module")
def ci_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path_factory.mktemp("etcd-ci"), auth=True)
    server.start()
    try:
        for words in _recipe():
            server.etcdctl(*words)
        yield server
    finally:
        server.stop()


def _cli(server: EtcdServer, user: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ALLOCATOR_", "ETCDCTL_"))}
    env.update(ALLOCATOR_STORE=f"etcd://{server.endpoint}", ETCDCTL_USER=f"{user}:{PASSWORD}")
    return subprocess.run(
        [sys.executable, "-m", "allocator", *args], env=env, capture_output=True, text=True
    )


def test_the_apply_role_can_apply_a_policy_with_its_compiled_form(ci_server: EtcdServer) -> None:
    applied = _cli(ci_server, "allocator-ci-apply", "policy", "apply", str(EXAMPLE))
    assert applied.returncode == 0, applied.stderr
    assert ci_server.etcdctl("get", "--keys-only", "/allocator/v1/compiled/policy").strip()
    assert ci_server.etcdctl("get", "--keys-only", "/allocator/v1/shares/common").strip()


def test_the_read_role_cannot_apply(ci_server: EtcdServer, tmp_path: Path) -> None:
    edited = tmp_path / "policy.yaml"
    edited.write_text(EXAMPLE.read_text().replace("gpus: 4", "gpus: 6", 1))
    refused = _cli(ci_server, "allocator-ci-read", "policy", "apply", str(edited))
    assert refused.returncode == 5, refused.stderr


def test_an_apply_role_granted_before_the_compiled_policy_still_applies(
    ci_server: EtcdServer, tmp_path: Path
) -> None:
    for words in _recipe():
        line = " ".join(words)
        if "allocator-ci-apply" in line and "/allocator/v1/compiled/" not in line:
            ci_server.etcdctl(*[w.replace("allocator-ci-apply", "allocator-ci-old") for w in words])
    edited = tmp_path / "policy.yaml"
    edited.write_text(EXAMPLE.read_text().replace("gpus: 4", "gpus: 5", 1))
    for _ in range(2):  # applied, then unchanged: neither fails for the key it may not write
        applied = _cli(ci_server, "allocator-ci-old", "policy", "apply", str(edited))
        assert applied.returncode == 0, applied.stderr
        assert "stored without its compiled form" in applied.stderr
    shown = _cli(ci_server, "allocator-ci-old", "policy", "show")
    assert "gpus: 5" in shown.stdout
