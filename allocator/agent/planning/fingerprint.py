"""A desired job's fingerprint: what its running workers cannot change without a restart.

The agent restarts a job whose fingerprint changed; fields added to a worker
later are left out while unset, so an upgrade restarts nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from allocator.agent.planning.types import WorkerSpec

__all__ = ["fingerprint"]

_NOT_FINGERPRINTED = frozenset({"ALLOCATOR_GPU_COUNT"})


def fingerprint(workers: Sequence[WorkerSpec]) -> str:
    """sha256 over every worker's argv, env, cwd and user: what a running process cannot change.

    ``user``/``group`` enter only when set, so jobs that name no one keep
    the fingerprints they had before the fields existed (no restart on upgrade).
    """
    body = [
        {
            "argv": list(w.argv),
            # ALLOCATOR_GPU_COUNT only repeats ALLOCATOR_GPUS: leaving it out keeps the
            # fingerprints workers had before it existed (no restart on upgrade).
            "env": {k: v for k, v in w.env.items() if k not in _NOT_FINGERPRINTED},
            "cwd": w.cwd,
            **({"user": w.user, "group": w.group} if w.user or w.group else {}),
            **({"container": _container_words(w)} if w.container is not None else {}),
        }
        for w in workers
    ]
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _container_words(worker: WorkerSpec) -> list[str]:
    """What of a worker's container a restart must follow (not its labels: the revision)."""
    run = worker.container
    if run is None:
        return []
    return [run.engine, run.image, *run.args, "--", *run.mounts, "--", *run.device_options]
