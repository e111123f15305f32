"""The ``container:`` field of a job: what it accepts, what it refuses and why."""

from __future__ import annotations

import pytest

from allocator.errors import PolicyError
from allocator.policy import load_policy
from allocator.policy.model import Container, Policy


def _load(container: str) -> Policy:
    return load_policy(
        f"""
version: 1
hosts: {{node1: {{gpus: 2}}}}
jobs:
  train:
    command: [python, train.py]
    container: {container}
"""
    )


def test_a_container_reads_with_its_defaults() -> None:
    policy = _load("{image: 'registry.example/train:1.4', mounts: ['/data:/data:ro']}")
    container = policy.jobs["train"].container
    assert container == Container(image="registry.example/train:1.4", mounts=("/data:/data:ro",))
    assert container.engine == "podman" and container.device_naming("nvidia") == "cdi"


def test_docker_names_devices_with_gpus_unless_told_cdi() -> None:
    docker = _load("{image: x, engine: docker}").jobs["train"].container
    assert docker is not None and docker.device_naming("nvidia") == "gpus"
    assert docker.device_naming("amd") == "cdi"
    cdi = _load("{image: x, engine: docker, devices: cdi}").jobs["train"].container
    assert cdi is not None and cdi.device_naming("nvidia") == "cdi"


@pytest.mark.parametrize(
    ("container", "words"),
    [
        ("{engine: podman}", "image"),
        ("{image: x, engine: containerd}", "podman"),
        ("{image: x, args: [--privileged]}", "--privileged is the agent's to set"),
        ("{image: x, args: ['--device=/dev/nvidia0']}", "--device is the agent's to set"),
        ("{image: x, args: [--gpus, all]}", "--gpus is the agent's to set"),
        ("{image: x, args: [-e, 'A=1']}", "-e is the agent's to set"),
        ("{image: x, mounts: ['data:/data']}", "absolute paths"),
        ("{image: x, mounts: ['/data:/data:rx']}", "unknown mount option"),
        ("{image: x, devices: all}", "cdi"),
    ],
)
def test_a_bad_container_is_refused_naming_the_field(container: str, words: str) -> None:
    with pytest.raises(PolicyError) as info:
        _load(container)
    assert "container" in str(info.value) and words in str(info.value)


@pytest.mark.parametrize(
    "args",
    [
        "[-itd]",  # -d in a cluster: the container would outlive its worker
        "['-eSECRET=x']",  # an attached short value
        "[-u, '0']",
        "[-v, '/dev:/dev']",
        "['--cap-add=SYS_ADMIN']",
        "['--device-cgroup-rule=c *:* rwm']",
        "['--mount=type=bind,src=/dev,dst=/dev']",
        "['--security-opt=label=disable']",
        "['--detach=true']",
        "[--shm-size, 8g]",  # a value in its own word: write --shm-size=8g
        "['--annotation=cdi.k8s.io/x=nvidia.com/gpu=all']",
    ],
)
def test_engine_arguments_are_an_allow_list_whatever_their_spelling(args: str) -> None:
    with pytest.raises(PolicyError) as info:
        _load(f"{{image: x, args: {args}}}")
    assert "container" in str(info.value) and "args" in str(info.value)


def test_the_allowed_engine_arguments_pass() -> None:
    args = "['--shm-size=8g', '--ipc=host', '--init', '--cap-drop=ALL', '--read-only']"
    container = _load(f"{{image: x, args: {args}}}").jobs["train"].container
    assert container is not None and container.args[0] == "--shm-size=8g"


@pytest.mark.parametrize("mount", ["/dev:/dev", "/dev/dri:/dev/dri", "/:/host"])
def test_a_mount_of_the_hosts_devices_is_refused(mount: str) -> None:
    with pytest.raises(PolicyError) as info:
        _load(f"{{image: x, mounts: ['{mount}']}}")
    assert "mounts" in str(info.value)


def test_a_container_job_in_a_fleet_of_apple_hosts_is_refused() -> None:
    with pytest.raises(PolicyError) as info:
        load_policy(
            """
version: 1
hosts: {mac1: {gpus: 1, vendor: apple}}
jobs:
  train: {command: [go], container: {image: x}}
"""
        )
    assert "Apple" in str(info.value) and "container" in str(info.value)


def test_intel_hosts_say_how_their_cdi_spec_names_devices() -> None:
    policy = load_policy(
        """
version: 1
hosts: {a: {gpus: 1, vendor: intel, cdi_names: pci}, b: {gpus: 1, pool: p}, c: {gpus: 1}}
pools: {p: {vendor: intel, cdi_names: pci}}
"""
    )
    assert [policy.cdi_names_of(h) for h in ("a", "b", "c")] == ["pci", "pci", "card"]
