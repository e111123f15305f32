"""A containerised worker's engine command line: devices, environment by name, labels."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import msgspec

from allocator.agent.planning.containers import container_argv, container_run
from allocator.agent.planning.desired import desired_jobs
from allocator.agent.planning.desired_inputs import DesiredInputs
from allocator.agent.planning.fingerprint import fingerprint
from allocator.agent.planning.types import DesiredJob
from allocator.policy import load_policy
from allocator.policy.model import Container, Policy
from allocator.records.gpu_info import GpuInfo, MigDevice
from allocator.records.types import Assignment

HOST = "node7"
INVENTORY = (
    GpuInfo(index=0, uuid="GPU-0000"),
    GpuInfo(index=1, uuid="GPU-0001"),
    GpuInfo(index=2, uuid="GPU-0002", mig_enabled=True, mig_devices=(MigDevice(uuid="MIG-2a"),)),
    GpuInfo(index=3),  # NVML could not say its UUID
)
PODMAN = Container(image="train:1", mounts=("/data:/data:ro",), args=("--shm-size=8g",))
DOCKER = Container(image="train:1", engine="docker")


def _run(container: Container, gpus: tuple[int, ...]) -> tuple[str, ...]:
    run = container_run(
        container, host=HOST, job="train", index=0, revision=42, gpus=gpus, inventory=INVENTORY
    )
    return container_argv(run, name="allocator-train.0.ab", env_names=("B", "A"), argv=("go",))


def _options(argv: tuple[str, ...], option: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word == option]


def test_podman_names_each_gpu_by_its_cdi_name_and_a_mig_gpu_by_its_instance() -> None:
    argv = _run(PODMAN, (1, 2, 3))
    assert argv[:5] == ("podman", "run", "--rm", "--name", "allocator-train.0.ab")
    assert _options(argv, "--device") == [
        "nvidia.com/gpu=GPU-0001",
        "nvidia.com/gpu=MIG-2a",  # NVIDIA's generated spec: instances under the one kind
        "nvidia.com/gpu=3",  # no UUID known: the index, as NVIDIA's CDI spec also names it
    ]
    assert "--gpus" not in argv
    # The policy's engine arguments and mounts, then the image, then the command.
    assert argv[-3:] == ("--shm-size=8g", "train:1", "go")
    assert _options(argv, "--volume") == ["/data:/data:ro"]


def test_docker_without_cdi_gets_one_quoted_gpus_option() -> None:
    argv = _run(DOCKER, (0, 1))
    assert argv[0] == "docker"
    assert _options(argv, "--gpus") == ['"device=GPU-0000,GPU-0001"']
    assert "--device" not in argv


def test_on_the_cpu_no_device_option_at_all() -> None:
    for container in (PODMAN, DOCKER):
        argv = _run(container, ())
        assert "--device" not in argv and "--gpus" not in argv
        assert not any(word.startswith("--gpus") for word in argv)


def test_the_environment_goes_in_by_name_only_and_labels_name_the_worker() -> None:
    argv = _run(PODMAN, (0,))
    assert _options(argv, "--env") == ["A", "B"]  # never NAME=VALUE: no value in argv or ps
    assert _options(argv, "--label") == [
        "allocator.job=train",
        "allocator.host=node7",
        "allocator.worker=0",
        "allocator.revision=42",
    ]


def _policy(container: Container | None) -> Policy:
    policy = load_policy(
        f"""
version: 1
hosts: {{{HOST}: {{gpus: 4}}}}
jobs: {{train: {{command: [go], fallback: cpu}}}}
fallback: {{cpu: {{action: cpu, threads: 2}}}}
"""
    )
    job = msgspec.structs.replace(policy.jobs["train"], container=container)
    return msgspec.structs.replace(policy, jobs={"train": job})


def _desired(policy: Policy, unhealthy: dict[int, str] | None = None) -> DesiredJob:
    assignment = Assignment(
        job="train", host=HOST, gpus=(1,), mode="gpu", updated_by="t", updated_at="now"
    )
    inputs = DesiredInputs(
        policy=policy,
        host=HOST,
        assignments={"train": assignment},
        assignment_revisions={"train": 9},
        inventory=INVENTORY,
        unhealthy=unhealthy or {},
        failed={},
    )
    return desired_jobs(inputs)["train"]


def test_the_planner_gives_each_worker_its_container_and_the_cpu_fallback_none() -> None:
    [worker] = _desired(_policy(PODMAN)).workers
    assert worker.container is not None
    assert worker.container.device_options == ("--device", "nvidia.com/gpu=GPU-0001")
    assert dict(worker.container.labels)["allocator.revision"] == "9"
    [worker] = _desired(_policy(PODMAN), {1: "XID 79"}).workers
    assert worker.container is not None
    assert worker.container.device_options == ()
    assert worker.env["CUDA_VISIBLE_DEVICES"] == ""


def test_a_new_image_restarts_the_job_a_host_job_keeps_its_fingerprint() -> None:
    host = _desired(_policy(None))
    boxed = _desired(_policy(PODMAN))
    other = _desired(_policy(msgspec.structs.replace(PODMAN, image="train:2")))
    assert len({d.fingerprint for d in (host, boxed, other)}) == 3
    # A host job's fingerprint is what it was before containers existed (no restart on upgrade).
    # Only the container's own parts differ: its container, and the legacy NVIDIA hook
    # told to inject nothing (the UUIDs in CUDA_VISIBLE_DEVICES mean the same inside).
    host_env = host.workers[0].env
    plain = [
        replace(w, container=None, env={**w.env, "NVIDIA_VISIBLE_DEVICES": "GPU-0001"})
        for w in boxed.workers
    ]
    assert host_env["NVIDIA_VISIBLE_DEVICES"] == "GPU-0001"
    assert fingerprint(plain) == host.fingerprint


def test_another_vendors_gpus_are_named_by_its_cdi_kind() -> None:
    run = container_run(
        PODMAN,
        host=HOST,
        job="t",
        index=0,
        revision=1,
        gpus=(0,),
        inventory=INVENTORY,
        vendor="amd",
    )
    # ROCm's container toolkit names GPUs by index (internal/cdi/cdi.go), never by UUID.
    assert run.device_options == ("--device", "amd.com/gpu=0")


def test_an_engine_missing_from_the_agents_path_is_one_clear_error(tmp_path: Path) -> None:
    import pytest

    from allocator.agent.processes.container_launch import EngineMissing, container_launch
    from allocator.agent.processes.job_state import WorkerRuntime

    job = _desired(_policy(DOCKER))
    worker = WorkerRuntime(
        spec=job.workers[0], pid=0, start_ticks=None, status_path=str(tmp_path / "t.0.ab.status")
    )
    with pytest.raises(EngineMissing, match="'docker' is not on the agent's PATH"):
        container_launch(job, worker, {"PATH": str(tmp_path)}, None)
    (tmp_path / "docker").write_text("#!/bin/sh\n")
    (tmp_path / "docker").chmod(0o755)
    launch = container_launch(job, worker, {"PATH": str(tmp_path), "SECRET_OF_AGENT": "x"}, None)
    assert launch.argv[0] == str(tmp_path / "docker") and launch.name == "allocator-t.0.ab"
    assert launch.settings["stop"].split("\x1f") == [
        str(tmp_path / "docker"),
        "stop",
        "-t",
        "10",
        "allocator-t.0.ab",
    ]
    assert "SECRET_OF_AGENT" not in launch.argv  # only the worker's own variables go in


def test_the_workers_cpu_set_is_given_to_the_engine_not_inherited() -> None:
    # docker's containers are the daemon's children: the shim's affinity never reaches them.
    run = container_run(
        DOCKER, host=HOST, job="train", index=0, revision=1, gpus=(0,), inventory=INVENTORY
    )
    argv = container_argv(run, name="n", env_names=(), argv=("go",), cpus=(0, 1, 2, 8), mems=(0,))
    assert "--cpuset-cpus=0-2,8" in argv and "--cpuset-mems=0" in argv
    assert argv.index("--cpuset-cpus=0-2,8") < argv.index("train:1")
    unpinned = container_argv(run, name="n", env_names=(), argv=("go",))
    assert not any(word.startswith("--cpuset") for word in unpinned)


def test_docker_on_amd_and_intel_defaults_to_cdi_nvidia_keeps_gpus() -> None:
    intel = (GpuInfo(index=0, drm_card=1),)
    for vendor, name, known in (
        ("amd", "amd.com/gpu=0", ()),
        ("intel", "intel.com/gpu=card1", intel),
    ):
        run = container_run(
            DOCKER,
            host=HOST,
            job="t",
            index=0,
            revision=1,
            gpus=(0,),
            inventory=known,
            vendor=vendor,
        )
        assert run.device_options == ("--device", name)
    nvidia = container_run(
        DOCKER, host=HOST, job="t", index=0, revision=1, gpus=(0,), inventory=INVENTORY
    )
    assert nvidia.device_options == ("--gpus", '"device=GPU-0000"')


def test_the_launch_passes_the_workers_pinning_to_the_engine(tmp_path: Path) -> None:
    from allocator.agent.processes.container_launch import container_launch
    from allocator.agent.processes.job_state import WorkerRuntime

    job = _desired(_policy(DOCKER))
    spec = replace(job.workers[0], cpus=(4, 5), mems=(1,))
    worker = WorkerRuntime(spec=spec, pid=0, start_ticks=None, status_path=str(tmp_path / "t.0.s"))
    (tmp_path / "docker").write_text("#!/bin/sh\n")
    (tmp_path / "docker").chmod(0o755)
    launch = container_launch(job, worker, {"PATH": str(tmp_path)}, None)
    assert "--cpuset-cpus=4-5" in launch.argv and "--cpuset-mems=1" in launch.argv
    # The engine writes the container's id next to the status file: its GPU processes
    # are found by it (docker's are the daemon's children, not the shim's).
    assert f"--cidfile={tmp_path / 't.0.cid'}" in launch.argv
