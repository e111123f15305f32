"""Reservations and priorities bind a self-service request to who asks, not to its job name.

node1 has 4 GPUs; GPU 3 is reserved for ``eval-*`` jobs and for this test's
user; ``urgent-*`` jobs get priority 5 (for an operator's ``set``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.e2e.conftest import Cli
from tests.support.waiting import wait_for

POLICY = """\
version: 1
hosts:
  node1: {gpus: 4}
reservations:
  - name: evals
    host: node1
    gpus: [3]
    for: ["eval-*"]
  - name: mine
    host: node1
    gpus: [2]
    who: ["user:%(me)s"]
priorities:
  - jobs: ["urgent-*"]
    priority: 5
"""


def _apply(cli: Cli, tmp_path: Path) -> None:
    from allocator.util.identity import os_user

    path = tmp_path / "policy.yaml"
    path.write_text(POLICY % {"me": os_user()})
    result = cli("policy", "apply", str(path))
    assert result.code == 0, result.err


def test_a_run_cannot_take_a_reserved_gpu_by_naming_its_job_after_the_reservation(
    cli: Cli, tmp_path: Path
) -> None:
    _apply(cli, tmp_path)
    taken = cli("run", "job=eval-mine", "gpus=3", "host=node1", "--wait=0", "--", "true")
    assert taken.code == 3, taken.err
    assert "reserved by 'evals'" in taken.err and len(taken.err.strip().splitlines()) == 1
    assert cli("set", "job=eval-nightly", "gpus=3", "host=node1").code == 0  # operators: by name
    mine = cli("run", "job=anything", "gpus=2", "host=node1", "--", "true")  # who asks: me
    assert mine.code == 0, mine.err


def test_a_run_gets_no_priority_from_its_job_name(
    cli: Cli, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    _apply(cli, tmp_path)
    assert cli("set", "job=hold", "count=3", "host=node1").code == 0
    words = ["job=urgent-1", "count=1", "host=node1", "--wait=60s", "--", "true"]
    ran = subprocess.Popen([sys.executable, "-m", "allocator", "run", *words], env=cli_env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:

        def listed() -> list[dict[str, object]]:
            out = cli("queue", "host=node1", "-o", "json").out
            return list(json.loads(out)["queue"])

        (entry,) = wait_for("the run in the queue", listed, 60)
        assert entry["job"] == "urgent-1" and entry["priority"] == 0
    finally:
        ran.kill()
        ran.communicate()
