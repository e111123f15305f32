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
    assert container.engine == "podman" and container.device_naming == "cdi"


def test_docker_names_devices_with_gpus_unless_told_cdi() -> None:
    docker = _load("{image: x, engine: docker}").jobs["train"].container
    assert docker is not None and docker.device_naming == "gpus"
    cdi = _load("{image: x, engine: docker, devices: cdi}").jobs["train"].container
    assert cdi is not None and cdi.device_naming == "cdi"


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
