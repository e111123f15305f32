"""The documented torchrun recipe, run as written: a real gloo all-reduce across two agents.

The job is the YAML block of docs/workers.md marked ``torchrun-recipe``,
with this test's own ``cwd`` (holding a ``train.py`` that all-reduces with
gloo on CPU tensors) and two variables for running on one machine: gloo's
loopback interface and a free ``MASTER_PORT``. Two agents on this machine
(node1 and node2, 2 fake GPUs each, one store) each start torchrun, which
starts 2 processes: 4 ranks in all. The finished job then frees its GPUs
(``release_on_exit: true``). On SQLite and on etcd.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.agent_harness import AgentHarness, hosts_of
from tests.support.etcd_server import free_port
from tests.support.ranks import two_host_all_reduce
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
GLOO = ROOT / "tests" / "support" / "gloo_worker.py"
TRAIN = """\
import json, os, runpy, sys
from pathlib import Path
here = Path(__file__).resolve().parent
rank = os.environ["RANK"]
(here / "ranks" / ("argv" + rank + ".json")).write_text(json.dumps(sys.argv[1:]))
sys.argv = [GLOO, str(here / "ranks")]
runpy.run_path(GLOO, run_name="__main__")
"""


def recipe() -> dict[str, Any]:
    """The policy fragment of the docs' torchrun recipe, parsed."""
    text = (ROOT / "docs" / "workers.md").read_text()
    block = re.search(r"<!-- torchrun-recipe -->\n```yaml\n(.*?)```", text, re.DOTALL)
    assert block is not None, "the torchrun recipe is gone from docs/workers.md"
    parsed: dict[str, Any] = yaml.safe_load(block.group(1))
    return parsed


@pytest.fixture
def hosts(tmp_path: Path, store_url: str, prefix: str) -> Iterator[list[AgentHarness]]:
    work = tmp_path / "ddp"
    (work / "ranks").mkdir(parents=True)
    (work / "train.py").write_text(f"GLOO = {str(GLOO)!r}\n{TRAIN}")
    policy = {"version": 1, "hosts": {"node1": {"gpus": 2}, "node2": {"gpus": 2}}, **recipe()}
    job = policy["jobs"]["ddp"]
    job["cwd"] = str(work)  # the test's own directory, as the only change to the job
    job["env"] = {"GLOO_SOCKET_IFNAME": "lo", "MASTER_PORT": str(free_port())}
    # torchrun is found on the agent's PATH: the interpreter under test's.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    with hosts_of(tmp_path, store_url, prefix, ("node1", "node2")) as named:
        agents = list(named.values())
        agents[0].apply_policy(policy)
        for agent in agents:
            agent.start_agent("--master-addr", "127.0.0.1", env={"PATH": path})
        yield agents


@pytest.mark.slow
def test_the_docs_torchrun_recipe_runs_a_gloo_all_reduce_across_two_agents(
    hosts: list[AgentHarness],
) -> None:
    node1, node2 = hosts
    result = node1.cli("set", "job=ddp", "host=node1,node2", "count=2", "-o", "json")
    assert result.code == 0, result.err
    port = str(json.loads(result.out)["master_port"])
    shown = node1.cli("env", "job=ddp", "host=node2")
    assert shown.code == 0, shown.err
    assert "export ALLOCATOR_GPU_COUNT=2" in shown.out
    assert shown.out.splitlines()[-1] == (
        f"# command: torchrun --nnodes=2 --node-rank=1 --master-addr=127.0.0.1 "
        f"--master-port={port} --nproc-per-node=2 train.py --checkpoint-dir=/srv/checkpoints/ddp"
    )
    ranks = node1.workdir.parent / "ddp" / "ranks"
    envs = two_host_all_reduce(ranks, "four torchrun ranks to all-reduce", 120)
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("127.0.0.1", port)}
    argv = json.loads((ranks / "argv3.json").read_text())
    assert argv == ["--checkpoint-dir=/srv/checkpoints/ddp"]  # $(ALLOCATOR_JOB), expanded
    # Every rank exited 0: the job finished and gave its GPUs back (release_on_exit).
    wait_for("the finished job's release", lambda: node1.cli("get", "job=ddp").code == 6, 60)
    assert node2.events("exit-released", job="ddp") or node1.events("exit-released", job="ddp")
