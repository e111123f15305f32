"""docs/ci.md runs as written, the pre-commit hook works, editors find the policy schema."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from allocator.cli import build_parser, main

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "config" / "policy.example.yaml"
DOC = REPO / "docs" / "ci.md"


def _workflow() -> dict[Any, Any]:
    blocks = re.findall(r"^```yaml\n(.*?)^```$", DOC.read_text(), re.DOTALL | re.MULTILINE)
    (workflow,) = [yaml.safe_load(b) for b in blocks if b.startswith("name: allocator policy")]
    assert isinstance(workflow, dict)
    return workflow


def _steps(job: str) -> dict[str, dict[str, Any]]:
    return {step["name"]: step for step in _workflow()["jobs"][job]["steps"] if "name" in step}


def _allocator_commands(script: str) -> list[list[str]]:
    """Every `allocator ...` command line of a step's script, as argv (variables kept as text)."""
    found = []
    for line in script.splitlines():
        if line.strip().startswith("allocator "):
            words = shlex.split(line)[1:]
            redirect = next((i for i, w in enumerate(words) if w[0] in "<>|"), len(words))
            found.append(words[:redirect])
    return found


def test_every_allocator_command_in_the_workflow_is_one_the_cli_takes() -> None:
    parser = build_parser()
    commands = [
        argv
        for job in ("check", "apply")
        for step in _steps(job).values()
        for argv in _allocator_commands(step.get("run", ""))
    ]
    assert [argv[:2] for argv in commands] == [
        ["policy", "validate"],
        ["policy", "diff"],
        ["policy", "apply"],
    ]
    for argv in commands:
        parser.parse_args(argv)  # an unknown command or option raises (exit 2)


def test_no_step_script_expands_github_expressions_itself() -> None:
    for job in ("check", "apply"):
        for name, step in _steps(job).items():
            assert "${{" not in step.get("run", ""), name


def _run_step(
    job: str, name: str, env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    """Run one `run:` step of the workflow with bash, as a GitHub runner would."""
    script = _steps(job)[name]["run"]
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def runner(tmp_path: Path) -> dict[str, str]:
    """A checkout with config/policy.yaml, a live store with the example applied, a runner's env."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "policy.yaml").write_text(EXAMPLE.read_text())
    store = f"sqlite://{tmp_path / 'live.db'}"
    assert main(["policy", "apply", str(EXAMPLE), "--store", store]) == 0
    assert main(["set", "job=train", "gpus=0", "host=node1", "--store", store]) == 0
    (tmp_path / "tmp").mkdir()
    return {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "POLICY": "config/policy.yaml",
        "ALLOCATOR_STORE": store,
        "ALLOCATOR_CA_PEM": "",
        "ETCDCTL_USER": "",
        "RUNNER_TEMP": str(tmp_path / "tmp"),
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
        "GITHUB_REPOSITORY": "example/gpu-policy",
        "GITHUB_SHA": "0123456789abcdef0123456789abcdef01234567",
        "GITHUB_ACTOR": "octocat",
        "CWD": str(tmp_path),
    }


def test_a_pull_request_is_validated_and_its_diff_summarised(
    runner: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    cwd = Path(runner["CWD"])
    policy = cwd / "config" / "policy.yaml"
    policy.write_text(policy.read_text().replace("grace_seconds: 30", "grace_seconds: 45"))

    assert _run_step("check", "Validate the policy", runner, cwd).returncode == 0
    compared = _run_step("check", "Compare with the live store", runner, cwd)

    assert compared.returncode == 0, compared.stderr
    summary = Path(runner["GITHUB_STEP_SUMMARY"]).read_text()
    assert "```diff\n" in summary and "+    grace_seconds: 45" in summary


def test_a_pull_request_that_breaks_a_current_assignment_fails_its_check(
    runner: dict[str, str],
) -> None:
    cwd = Path(runner["CWD"])
    policy = cwd / "config" / "policy.yaml"
    reserve = '  - {name: gpu0, host: node1, gpus: [0], for: ["eval-*"]}\n'
    policy.write_text(policy.read_text().replace("reservations:\n", "reservations:\n" + reserve))

    compared = _run_step("check", "Compare with the live store", runner, cwd)

    assert compared.returncode == 1, compared.stderr
    assert "::error::the policy conflicts with 1 current assignment(s)" in compared.stdout
    summary = Path(runner["GITHUB_STEP_SUMMARY"]).read_text()
    assert ":x: would conflict with a current assignment: train@node1" in summary


def test_an_invalid_policy_fails_validation_in_one_line(runner: dict[str, str]) -> None:
    cwd = Path(runner["CWD"])
    (cwd / "config" / "policy.yaml").write_text("version: 1\nhosts: {node1: {gpus: many}}\n")
    result = _run_step("check", "Validate the policy", runner, cwd)
    assert result.returncode == 2
    assert "hosts.node1.gpus" in result.stderr and result.stderr.count("\n") == 1


def test_a_merge_applies_the_policy_with_the_commit_in_its_history(
    runner: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    cwd = Path(runner["CWD"])
    policy = cwd / "config" / "policy.yaml"
    policy.write_text(policy.read_text() + "\nhistory: {entries_per_host: 500}\n")

    applied = _run_step("apply", "Apply the policy", runner, cwd)

    assert applied.returncode == 0, applied.stderr
    assert "## allocator policy applied" in Path(runner["GITHUB_STEP_SUMMARY"]).read_text()
    capsys.readouterr()
    assert main(["history", "--store", runner["ALLOCATOR_STORE"], "-o", "json"]) == 0
    newest = json.loads(capsys.readouterr().out)["entries"][0]
    assert newest["action"] == "policy-apply"
    assert newest["reason"] == "example/gpu-policy@0123456789ab by octocat"


# --- pre-commit and editors ---------------------------------------------------------------


def test_the_pre_commit_hook_validates_every_file_it_is_given(tmp_path: Path) -> None:
    (hook,) = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    assert hook["id"] == "allocator-policy-validate" and hook["language"] == "python"
    assert re.search(hook["files"], "config/policy.yaml")
    assert re.search(hook["files"], "deploy/policy-prod.yml")
    assert not re.search(hook["files"], "docker-compose.yml")
    good = tmp_path / "policy-a.yaml"
    good.write_text(EXAMPLE.read_text())
    bad = tmp_path / "policy-b.yaml"
    bad.write_text("version: 1\nhosts: {node1: {gpus: many}}\n")
    warned = tmp_path / "policy-c.yaml"
    warned.write_text("version: 1\nhosts: {node1: {gpus: 2}, NODE1: {gpus: 2}}\n")
    argv = shlex.split(hook["entry"])
    assert argv[0] == "allocator"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}

    def hook_run(*files: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*argv, *map(str, files)], env=env, capture_output=True, text=True, check=False
        )

    assert hook_run(good).returncode == 0
    refused = hook_run(good, bad, warned)
    assert refused.returncode == 2
    errors = refused.stderr.splitlines()
    assert len(errors) == 2 and "policy-b.yaml" in errors[0] and "policy-c.yaml" in errors[1]
    assert f"{good}: ok" in refused.stdout


def test_the_example_policy_names_its_schema_for_editors() -> None:
    first = EXAMPLE.read_text().splitlines()[0]
    match = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", first)
    assert match is not None
    schema = (EXAMPLE.parent / match.group(1)).resolve()
    assert schema == (REPO / "config" / "policy.schema.json").resolve() and schema.is_file()


#: A requirement pinned to one commit of a git repository: name[extras] @ git+URL@<full sha>.
_AT_COMMIT = re.compile(r"^[A-Za-z0-9_.-]+(\[[^\]]*\])? @ git\+https://\S+@[0-9a-f]{40}$")


def test_each_install_step_pins_what_it_installs() -> None:
    """The apply job holds the production credential: it installs one reviewed commit, not
    whatever a package index serves under a name (nobody holds ``gpu-allocator`` yet)."""
    for job in ("check", "apply"):
        script = _steps(job)["Install allocator"]["run"]
        words = shlex.split(script)
        assert words[:4] == ["python", "-m", "pip", "install"], script
        requirements = [w for w in words[4:] if not w.startswith("-")]
        hashed = "--require-hashes" in words
        assert requirements, script
        for requirement in requirements:
            assert hashed or _AT_COMMIT.match(requirement), (job, requirement)
