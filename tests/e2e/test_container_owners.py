"""A real container's processes are found by the id its engine wrote to the cidfile."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from allocator.agent.gpu_care.unassigned_use import TreeRoot, find_owners
from tests.support.podman import Podman, podman_or_skip

pytestmark = [pytest.mark.container]


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    yield from podman_or_skip(tmp_path_factory.mktemp("podman"))


def test_the_containers_process_is_its_jobs_by_the_cidfile(podman: Podman, tmp_path: Path) -> None:
    cidfile = tmp_path / "train.0.ab.cid"
    podman.run("run", "-d", "--rm", f"--cidfile={cidfile}", podman.image, "sleep", "30")
    cid = cidfile.read_text().strip()
    try:
        pid = int(podman.run("inspect", "--format", "{{.State.Pid}}", cid).strip())
        # Not below any shim: only the container's id can tell whose it is.
        roots = {"train": [TreeRoot(pid=1, start_ticks=None, cidfile=str(cidfile))]}
        assert find_owners([pid, 1], roots) == {pid: "train"}
        assert find_owners([pid], {"train": [TreeRoot(pid=1, start_ticks=None)]}) == {}
    finally:
        podman.run("rm", "-f", "-t", "0", cid, check=False)
