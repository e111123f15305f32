"""docker-compose.yml's own walk-through, and its agent health check, run as written.

No container runtime is needed: the same commands run against a real agent
on a fake 4-GPU host, with the store on SQLite instead of the compose file's
etcd (the commands do not depend on the backend).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.e2e.agent_harness import AgentHarness, pid_alive
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())


def _walkthrough() -> list[list[str]]:
    """The `docker-compose exec|run --rm agent allocator ...` lines of the file's header."""
    header = (REPO / "docker-compose.yml").read_text().split("services:")[0]
    line = r"^#[ \t]+docker-compose (?:exec|run --rm) agent (allocator [^#\n]+?)[ \t]*(?:#[^\n]*)?$"
    found = re.findall(line, header, re.M)
    return [line.split() for line in found]


def _compose_lines() -> list[list[str]]:
    """The compose command lines of the header (``docker-compose ...``), from the subcommand on."""
    header = (REPO / "docker-compose.yml").read_text().split("services:")[0]
    found = re.findall(r"^#[ \t]+docker-compose (.+?)[ \t]*(?:#[^\n]*)?$", header, re.M)
    return [shlex.split(line) for line in found]


def test_the_walkthrough_takes_only_options_the_installed_compose_knows() -> None:
    """The test servers install Debian's docker-compose (v1; Debian ships no Compose v2): each
    option the walk-through gives, global or of its subcommand, is one its help lists."""
    compose = shutil.which("docker-compose")
    assert compose is not None, "docker-compose is missing: run tools/install-test-servers"
    lines = _compose_lines()
    assert len(lines) >= 6
    helps: dict[str, str] = {}
    for sub, *rest in lines:
        helps.setdefault(sub, _help(compose, sub))
        for word in (w for w in rest if w.startswith("-")):
            assert re.search(rf"(^|[\s,]){re.escape(word)}\b", helps[sub]), (sub, word)


def _help(compose: str, *sub: str) -> str:
    ran = subprocess.run(
        [compose, *sub, "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert ran.returncode == 0, ran.stderr
    return ran.stdout


def _health(harness: AgentHarness) -> int:
    """The agent service's health check, run by a shell as docker would (CMD-SHELL)."""
    kind, command = COMPOSE["services"]["agent"]["healthcheck"]["test"]
    assert kind == "CMD-SHELL"
    path = f"{Path(sys.executable).parent}{os.pathsep}{harness.env.get('PATH', '')}"
    result = subprocess.run(
        ["sh", "-c", command],
        env={**harness.env, "PATH": path},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return result.returncode


def _said(workdir: Path) -> str | None:
    """The GPUs the hello job printed it was given, from its log."""
    for log in workdir.rglob("hello.log"):
        found = re.search(r"hello on GPUs (\S+)", log.read_text())
        if found:
            return found.group(1)
    return None


def _policy_in_repo(words: list[str]) -> list[str]:
    return [w.replace("/src/", f"{REPO}/") for w in words]


def test_the_walkthrough_runs_a_worker_and_releases_it(tmp_path: Path, prefix: str) -> None:
    harness = AgentHarness(tmp_path, f"sqlite://{tmp_path / 'store.db'}", prefix)
    steps = _walkthrough()
    assert [s[1] for s in steps] == ["policy", "set", "status", "release"]
    try:
        apply, set_, status, release = (_policy_in_repo(s) for s in steps)
        assert harness.cli(*apply[1:]).code == 0
        harness.start_agent()
        assert harness.cli(*set_[1:]).code == 0

        def hello_pid() -> int | None:
            record = harness.worker_record("hello")
            running = record is not None and record.state == "running" and record.pids
            return record.pids[0] if running and record is not None else None

        pid = wait_for("hello's worker to run", hello_pid)
        shown = harness.cli(*status[1:])
        assert shown.code == 0 and "hello" in shown.out
        env = harness.cli("env", "job=hello", "-o", "json")
        (given,) = json.loads(env.out)
        assert given["ALLOCATOR_GPUS"] == "1,2"
        said = wait_for("hello to say which GPUs it was given", lambda: _said(tmp_path))
        assert said == given["CUDA_VISIBLE_DEVICES"]  # GPUs 1 and 2, by UUID
        assert harness.cli(*release[1:]).code == 0
        wait_for("hello's worker to stop", lambda: not pid_alive(pid))
    finally:
        harness.cleanup()


def test_the_health_check_fails_once_the_agent_is_gone(tmp_path: Path, prefix: str) -> None:
    harness = AgentHarness(tmp_path, f"sqlite://{tmp_path / 'store.db'}", prefix)
    try:
        assert (
            harness.cli("policy", "apply", str(REPO / "config" / "policy.compose.yaml")).code == 0
        )
        assert _health(harness) != 0  # no agent yet
        harness.start_agent()
        assert _health(harness) == 0
        assert harness.stop_agent() == 0  # an orderly stop revokes the agent's lease
        assert _health(harness) != 0
    finally:
        harness.cleanup()
