"""``allocator demo``: the quick start, on a throw-away SQLite store.

It runs the real CLI commands in-process against a temporary store, so what
it prints is exactly what an operator would see, and removes everything it
created when it ends.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["register"]

DEFAULT_POLICY = Path(__file__).resolve().parents[2] / "config" / "policy.example.yaml"

#: (command words, exit code the step must end with)
STEPS: tuple[tuple[str, int], ...] = (
    ("policy validate {policy}", 0),
    ("policy apply {policy}", 0),
    ("set job=train gpus=0,1 host=node1 reason=baseline-run", 0),
    ("set job=notebook count=1 host=node1", 0),
    ("set job=finetune gpus=1 host=node1", 3),
    ("set job=finetune gpus=3 host=node1", 3),
    ("set job=eval-nightly gpus=3 host=node1 reason=nightly", 0),
    ("set job=big count=6 host=node2", 2),
    ("set job=big count=4 host=node2", 0),
    ("set job=oops gpus=9 host=node1", 2),
    ("get job=train", 0),
    ("release job=notebook reason=done-for-today", 0),
    ("status", 0),
    ("history host=node1", 0),
)


def register(commands: Any) -> None:
    """Add the ``demo`` command."""
    parser = commands.add_parser(
        "demo",
        help="run a short tour on a temporary store (leaves nothing behind)",
        description=__doc__,
    )
    parser.add_argument("--policy", default=str(DEFAULT_POLICY), help="policy file to apply")
    parser.add_argument("--no-agent", action="store_true", help="skip the agent part")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run every step; fail (exit 1) if any step ends with an unexpected code."""
    from allocator.cli import main
    from allocator.errors import RequestError

    policy = Path(args.policy)
    if not policy.is_file():
        raise RequestError(f"demo policy {policy} not found (give one with --policy FILE)")
    with tempfile.TemporaryDirectory(prefix="allocator-demo-") as tmp:
        store = f"sqlite://{Path(tmp) / 'store.db'}"
        print(f"# a temporary store: {store}\n")
        for template, expected in STEPS:
            words = shlex.split(template.format(policy=shlex.quote(str(policy))))
            print(f"$ allocator {' '.join(shlex.quote(w) for w in words)}", flush=True)
            code = main(["--store", store, *words])  # before the command: every one takes it
            sys.stdout.flush()
            sys.stderr.flush()
            print(f"# exit {code}\n" if code else "", flush=True)
            if code != expected:
                print(f"demo: expected exit {expected}, got {code}", file=sys.stderr)
                return 1
        if not args.no_agent:
            from allocator.cli.demo_agent import run_agent_tour

            print("# part 2: a host agent on a fake 4-GPU host runs the job's worker\n")
            try:
                run_agent_tour(Path(tmp), main)
            except RuntimeError as exc:
                print(f"demo: {exc}", file=sys.stderr)
                return 1
    print("# done: the temporary store is gone")
    return 0
