"""A rank of a job across hosts: one real ``torch.distributed`` gloo all-reduce, then exit 0.

It joins the process group from nothing but the environment the agent gave
it (``init_process_group("gloo")`` reads ``MASTER_ADDR``, ``MASTER_PORT``,
``RANK`` and ``WORLD_SIZE``), all-reduces a CPU tensor holding ``RANK + 1``,
and writes ``rank<RANK>.json`` (atomically) into the directory named by its
only argument: the sum, the group's rank and size, and the rendezvous
variables it was started with.

Run with the interpreter under test (``sys.executable``); it imports nothing
from the project.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

SHOWN = (
    "ALLOCATOR_HOST",
    "ALLOCATOR_NODE_RANK",
    "ALLOCATOR_NNODES",
    "GROUP_RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
)


def main(out: Path) -> int:
    """Join, all-reduce, report."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    report = {
        "rank": dist.get_rank(),
        "world": dist.get_world_size(),
        "sum": value.item(),
        "env": {name: os.environ.get(name) for name in SHOWN},
    }
    dist.destroy_process_group()
    tmp = out / f".rank{report['rank']}.tmp"
    tmp.write_text(json.dumps(report, sort_keys=True))
    os.replace(tmp, out / f"rank{report['rank']}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
