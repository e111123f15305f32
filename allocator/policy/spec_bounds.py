"""Bounds of the policy file's fields: what hardware has, or more than any sane policy needs.

Each stops a typo (or a hostile file) from costing memory or time before
anything runs. The section specs (:mod:`allocator.policy.hosts_spec`,
:mod:`allocator.policy.jobs_spec`, :mod:`allocator.policy.health_spec`) share them.
"""

from __future__ import annotations

from allocator.policy.yamlspec.kinds import Str
from allocator.records.fields import MAX_GPU_INDEX

__all__ = [
    "ARGUMENT",
    "DAY",
    "GPU_LIMIT",
    "HOUR",
    "MAX_ARGUMENTS",
    "MAX_ARGUMENT_LENGTH",
    "MAX_ENV_ENTRIES",
    "MAX_GLOBS",
    "MAX_HOSTS",
    "MAX_HOST_GPUS",
    "MAX_JOBS",
    "MAX_RESERVATIONS",
    "MAX_RESTARTS",
    "MAX_SMALL_SECTION",
    "MAX_THREADS",
    "MAX_XID",
    "MAX_XID_ITEMS",
    "MIN_HEALTH_INTERVAL",
]

#: GPUs on one host: the indices every part accepts run 0..MAX_GPU_INDEX.
MAX_HOST_GPUS = MAX_GPU_INDEX + 1
#: Why a GPU count or index past the bound is refused.
GPU_LIMIT = f"a host has at most {MAX_HOST_GPUS:,} GPUs, indices 0-{MAX_GPU_INDEX:,}"
#: 25,000 hosts of 8 GPUs (200,000 GPUs, the largest training clusters) and
#: room to grow. Compiled (42 B a host), 32,768 hosts make 334 parts of about
#: 4 KB, written about 60 to a transaction of at most 256 KiB, and a record
#: naming them of 23 KB: inside etcd's default 128 operations and 1.5 MiB a
#: request, with room.
MAX_HOSTS = 32_768
MAX_JOBS = 10_000
MAX_RESERVATIONS = 1_000
MAX_SMALL_SECTION = 1_000
MAX_GLOBS = 100
#: Matches what an assignment's ad-hoc command may hold (allocator.records.types).
MAX_ARGUMENTS = 4096
MAX_ARGUMENT_LENGTH = 65_536
MAX_ENV_ENTRIES = 1024
MAX_THREADS = 4096
MAX_RESTARTS = 10_000
MAX_XID = 65_535
MAX_XID_ITEMS = 1024
#: Health checks more often than this only burn the agent's CPU.
MIN_HEALTH_INTERVAL = 0.1
HOUR = 3600.0
DAY = 86_400.0
#: One argument of a command (a job's, or the health recovery probe's).
ARGUMENT = Str(max_length=MAX_ARGUMENT_LENGTH)
