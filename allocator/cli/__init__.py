"""The ``allocator`` command line.

Every command lives in its own module with ``register(subparsers)``; a
module imports its heavy dependencies (YAML, tenacity, a store backend) only
inside the function that runs the command, so ``allocator --help`` and
``allocator get`` start fast and never load torch or grpc they do not use.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from allocator import __version__
from allocator.cli.common import CliArgumentParser, add_common_options
from allocator.errors import EXIT_INTERNAL, AllocatorError, BadRecord

__all__ = ["build_parser", "main"]

#: Command modules, in the order ``--help`` lists them.
COMMAND_MODULES = (
    "allocator.cli.assign",
    "allocator.cli.get",
    "allocator.cli.release",
    "allocator.cli.status",
    "allocator.cli.policy",
    "allocator.cli.env",
    "allocator.cli.doctor",
    "allocator.cli.agent",
    "allocator.cli.serve",
    "allocator.cli.demo",
)

_LABELS = {
    2: "error",
    3: "conflict",
    4: "store unavailable",
    5: "permission denied",
    6: "not found",
}


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, every command registered."""
    parser = CliArgumentParser(
        prog="allocator",
        description="Centralized GPU allocator: assign GPUs to jobs, see who holds what, "
        "and run each host's workers with CUDA_VISIBLE_DEVICES set.",
        epilog="exit codes: 0 ok, 1 internal error, 2 invalid input, 3 conflict, "
        "4 store unreachable, 5 permission denied, 6 not found",
    )
    parser.add_argument("--version", action="version", version=f"allocator {__version__}")
    add_common_options(parser)
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=CliArgumentParser
    )
    commands.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the process exit code (never raises for bad input)."""
    try:
        args = build_parser().parse_args(argv)
        code: int = args.handler(args)
        return code
    except BadRecord as exc:  # damaged data in the store, not a bug here
        _fail("error", f"{exc}; rewrite it (for the policy: `allocator policy apply FILE`)")
        return exc.exit_code
    except AllocatorError as exc:
        _fail(_LABELS.get(exc.exit_code, "internal error"), str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        _fail("error", "interrupted")
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:
        if os.environ.get("ALLOCATOR_DEBUG"):
            raise
        _fail(
            "internal error", f"{type(exc).__name__}: {exc} (set ALLOCATOR_DEBUG=1 for a traceback)"
        )
        return EXIT_INTERNAL


def _fail(label: str, message: str) -> None:
    from allocator.secrets import redact

    sys.stderr.write(f"allocator: {label}: {one_line(redact(message))}\n")


def one_line(message: str) -> str:
    """Collapse whitespace and escape control characters a user may have typed.

    An error message often quotes the input; a typed ``\x1e`` or newline must
    not split the one line a script reads from stderr.
    """
    collapsed = " ".join(message.split())
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in collapsed)


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
