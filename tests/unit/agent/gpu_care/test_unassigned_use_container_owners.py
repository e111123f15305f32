"""GPU processes in a worker's container (docker's: not below the shim) are the job's."""

from __future__ import annotations

from pathlib import Path

from allocator.agent.gpu_care.unassigned_use import (
    TreeRoot,
    find_owners,
    read_proc_cgroup,
    unassigned_processes,
)
from allocator.gpus.usage import GpuUsage, ProcessOnGpu

CONTAINER_ID = "3f" * 32
OTHER_ID = "9a" * 32


def _fake_proc(root: Path, cgroups: dict[int, str]) -> None:
    """A /proc with only each pid's cgroup file (and no stat: no ancestry to follow)."""
    for pid, line in cgroups.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(line)


def _owners(tmp_path: Path, pids: list[int], cidfile: Path) -> dict[int, str]:
    roots = {"train": [TreeRoot(pid=10, start_ticks=1, cgroup="", cidfile=str(cidfile))]}
    return find_owners(
        pids,
        roots,
        read_stat=lambda pid: None,  # the daemon's child: not below the shim
        members=lambda path: [],
        read_cgroup=lambda pid: read_proc_cgroup(pid, proc=tmp_path / "proc"),
    )


def test_a_process_in_the_workers_container_cgroup_is_the_jobs(tmp_path: Path) -> None:
    _fake_proc(
        tmp_path / "proc",
        {
            501: f"0::/system.slice/docker-{CONTAINER_ID}.scope\n",  # systemd driver, cgroup v2
            502: f"12:memory:/docker/{CONTAINER_ID}\n4:cpu:/docker/{CONTAINER_ID}\n",  # cgroupfs
            503: f"0::/system.slice/docker-{OTHER_ID}.scope\n",  # someone else's container
            504: "0::/user.slice/user-1000.slice/session-3.scope\n",  # a notebook
        },
    )
    cidfile = tmp_path / "train.0.ab.cid"
    cidfile.write_text(CONTAINER_ID)  # what the engine's --cidfile wrote
    owners = _owners(tmp_path, [501, 502, 503, 504, 505], cidfile)
    assert owners == {501: "train", 502: "train"}
    usage = [
        GpuUsage(index=0, processes=(ProcessOnGpu(pid=501), ProcessOnGpu(pid=504))),
        GpuUsage(index=1, processes=(ProcessOnGpu(pid=502),)),
    ]
    found = unassigned_processes(usage, {"train": [0]}, owners, lambda pid: ("u", "c"))
    # Its own GPU is its business; another GPU, or another's process, is reported.
    assert [(p.gpu, p.pid, p.job) for p in found] == [(0, 504, None), (1, 502, "train")]


def test_no_container_id_yet_claims_nothing(tmp_path: Path) -> None:
    _fake_proc(tmp_path / "proc", {501: "0::/\n"})
    (tmp_path / "empty.cid").write_text("")  # the engine has not written it yet
    assert _owners(tmp_path, [501], tmp_path / "empty.cid") == {}
    assert _owners(tmp_path, [501], tmp_path / "missing.cid") == {}


def test_the_real_proc_cgroup_of_this_process_is_read() -> None:
    import os

    assert read_proc_cgroup(os.getpid()) == Path(f"/proc/{os.getpid()}/cgroup").read_text()
    assert read_proc_cgroup(2**22 + 1) == ""  # above pid_max: no such process
