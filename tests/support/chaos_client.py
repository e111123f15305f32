"""One client of a fault run: the real CLI, in a loop, each command timed and logged.

``chaos_client.py --seed N --until T --log PATH --hosts A,B --jobs A:j1,B:j2
--worker CMD...`` runs, until the wall-clock time ``T``, random commands
against the store in ``$ALLOCATOR_STORE``, each as ``python -m allocator``:

* ``set job=J host=H`` with ``count=1`` or one named GPU (the agent's jobs);
* ``release job=J host=H``;
* ``run --wait=0 job=R host=H count=1 -- WORKER`` (refused at once when
  busy) and the same with ``--wait=5s`` (the wait queue), ``R`` unique to
  this client and command.

Each command is one JSON line in the log: kind, host, job, argv, ``invoke``
(just before it started), ``complete`` (just after it returned; ``null``
with ``code`` ``null`` when it had to be killed after 60 s). Those times
bracket when the command's change can have been written, which is what
the checker (``chaos_check.py``) reasons with.

Run standalone with the interpreter under test; it imports nothing from
the project.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

_COMMAND_TIMEOUT_S = 60.0


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="one client of a fault run")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--until", type=float, required=True, help="wall-clock end (time.time())")
    parser.add_argument("--log", required=True)
    parser.add_argument("--hosts", required=True)
    parser.add_argument("--jobs", required=True, help="HOST:JOB,... the agent jobs to set")
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--worker", nargs=argparse.REMAINDER, required=True)
    return parser.parse_args(argv)


def _pick(
    rng: random.Random, args: argparse.Namespace, serial: int
) -> tuple[str, str, str, list[str]]:
    """One command: (kind, host, job, its words after ``allocator``)."""
    jobs = [pair.split(":", 1) for pair in args.jobs.split(",")]
    roll = rng.random()
    if roll < 0.6:
        host, job = rng.choice(jobs)
        if roll < 0.35:
            gpus = f"gpus={rng.randrange(args.gpus)}" if rng.random() < 0.5 else "count=1"
            return "set", host, job, ["set", f"job={job}", f"host={host}", gpus]
        return "release", host, job, ["release", f"job={job}", f"host={host}"]
    host = rng.choice(args.hosts.split(","))
    job = f"r{args.seed}-{serial}"
    wait = ["--wait=5s"] if roll < 0.8 else ["--wait=0"]
    worker = [*args.worker, "--exit-after", f"{rng.uniform(0.3, 1.5):.2f}"]
    return "run", host, job, ["run", *wait, f"job={job}", f"host={host}", "count=1", "--", *worker]


def main(argv: list[str]) -> int:
    """Run commands until the end time; log each."""
    args = _parse(argv)
    rng = random.Random(args.seed)
    serial = 0
    with open(args.log, "a", encoding="utf-8") as log:
        while time.time() < args.until:
            serial += 1
            kind, host, job, words = _pick(rng, args, serial)
            invoke = time.time()
            proc = subprocess.Popen(
                [sys.executable, "-m", "allocator", *words],
                # `run` takes GPUs of the machine it runs on: this one plays ``host``.
                env={**os.environ, "ALLOCATOR_HOST": host},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            try:
                _, err = proc.communicate(timeout=_COMMAND_TIMEOUT_S)
                code: int | None = proc.returncode
                complete: float | None = time.time()
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
                code, complete = None, None
            line = {
                "kind": kind,
                "host": host,
                "job": job,
                "argv": words,
                "invoke": invoke,
                "complete": complete,
                "code": code,
                "stderr": err.decode(errors="replace")[-300:],
            }
            log.write(json.dumps(line, sort_keys=True) + "\n")
            log.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
