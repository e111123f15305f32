"""Start-up stays lean: commands never import what they do not use."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = (
    "torch",
    "grpc",
    "aetcd",
    "consul",
    "requests",
    "pynvml",
    "numpy",
    # Only `allocator serve` and an agent with --metrics-port need these.
    "starlette",
    "uvicorn",
    "prometheus_client",
)
_EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "policy.example.yaml"

_PROBE = """
import json, sys
from allocator.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def _modules_after(args: list[str], env_store: str) -> tuple[int, set[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"ALLOCATOR_STORE": env_store, "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
        check=False,
    )
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    return int(report["code"]), set(report["modules"])


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY)


@pytest.mark.parametrize(
    "args",
    [["--help"], ["get", "job=train"], ["status"], ["policy", "--help"]],
)
def test_cli_commands_import_nothing_heavy(args: list[str], tmp_path: Path) -> None:
    from allocator.store import open_store

    url = f"sqlite://{tmp_path / 's.db'}"
    open_store(url).put("/other", b"")  # an existing store: reads go all the way through
    code, modules = _modules_after(args, url)
    assert code in (0, 6), code  # 6: the job holds nothing
    assert _heavy(modules) == []
    assert "allocator.torch" not in modules
    assert "h11" not in modules  # etcd's HTTP parser: loaded for etcd URLs only


def test_no_module_imports_a_grpc_client() -> None:
    # etcd is reached through its JSON gateway alone: one client, no grpc anywhere.
    root = Path(__file__).resolve().parents[2]
    found = []
    for path in [*(root / "allocator").rglob("*.py"), *(root / "bench").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            found += [f"{path.relative_to(root)}: {n}" for n in names if _is_grpc(n)]
    assert found == []


def _is_grpc(module: str) -> bool:
    return module.split(".")[0] in ("grpc", "aetcd", "etcd3", "etcd3gw")


def test_help_does_not_even_load_yaml_or_tenacity(tmp_path: Path) -> None:
    _, modules = _modules_after(["--help"], f"sqlite://{tmp_path / 's.db'}")
    assert "yaml" not in modules and "tenacity" not in modules
    assert "sqlite3" not in modules


def test_the_agent_loads_no_metrics_or_web_stack_until_asked() -> None:
    probe = "import json, sys, allocator.agent.daemon; print(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert _heavy(set(json.loads(proc.stdout))) == []


@pytest.mark.parametrize(
    "args",
    [
        ["set", "job=train", "gpus=0", "host=node1"],
        ["get", "job=train"],
        ["status"],
        ["release", "job=train", "host=node1"],
    ],
)
def test_commands_on_etcd_talk_json_and_load_nothing_heavy(
    args: list[str], etcd_server: object, prefix: str
) -> None:
    from allocator.control.client import Allocator
    from allocator.store import open_store

    url = str(etcd_server.url)  # type: ignore[attr-defined]
    store = open_store(url)
    try:
        allocator = Allocator(store, prefix=prefix)
        allocator.apply_policy(_EXAMPLE.read_text(), "policy.yaml")
        if args[0] != "set":
            setup = ["--prefix", prefix, "set", "job=train", "gpus=0", "host=node1"]
            code, _ = _modules_after(setup, url)
            assert code == 0
    finally:
        store.close()
    code, modules = _modules_after(["--prefix", prefix, *args], url)
    assert code == 0
    assert _heavy(modules) == []


def test_set_on_etcd_reads_the_compiled_policy_and_loads_only_what_it_uses(
    etcd_server: object, prefix: str
) -> None:
    from allocator.control.client import Allocator
    from allocator.store import open_store

    url = str(etcd_server.url)  # type: ignore[attr-defined]
    store = open_store(url)
    try:
        Allocator(store, prefix=prefix).apply_policy(_EXAMPLE.read_text(), "policy.yaml")
    finally:
        store.close()
    code, modules = _modules_after(
        ["--prefix", prefix, "set", "job=a", "gpus=1", "host=node1"], url
    )
    assert code == 0
    unused = {
        "yaml",  # the compiled policy is read instead
        "allocator.policy.loader",
        "allocator.cli.status",  # other commands' modules
        "allocator.cli.policy",
        "encodings.idna",  # the host name goes to getaddrinfo as ASCII bytes
        "hashlib",  # OpenSSL's start-up; the policy's hash is checked without it
        "shutil",  # argparse's terminal width, asked without it
        "allocator.placement.ranking",  # only count=N ranks GPUs
    }
    assert sorted(unused & modules) == []
