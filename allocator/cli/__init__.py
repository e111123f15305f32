"""The ``allocator`` command line.

Every command lives in its own module with ``register(subparsers)``; a
module imports its heavy dependencies (YAML, tenacity, a store backend) only
inside the function that runs the command, so ``allocator --help`` and
``allocator get`` start fast and never load torch or a store client they do not use.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from allocator import __version__
from allocator.cli.common import (
    CliArgumentParser,
    add_common_options,
    machine_output,
    set_structured_stderr,
    warn_of_secrets_in_argv,
)
from allocator.errors import EXIT_INTERNAL, AllocatorError, BadRecord
from allocator.util.command_words import command_word
from allocator.util.printable import one_line

__all__ = [
    "COMMANDS",
    "ERROR_NAMES",
    "build_parser",
    "command_word",
    "error_document",
    "main",
    "parser_for",
    "run",
]

#: Each command and the module that registers it, in the order ``--help`` lists them.
COMMANDS = {
    "set": "allocator.cli.set",
    "get": "allocator.cli.get",
    "release": "allocator.cli.release",
    "status": "allocator.cli.status",
    "history": "allocator.cli.history",
    "queue": "allocator.cli.queue",
    "cancel": "allocator.cli.cancel",
    "policy": "allocator.cli.policy",
    "env": "allocator.cli.env",
    "run": "allocator.cli.run",
    "submit": "allocator.cli.submit",
    "usage": "allocator.cli.usage",
    "doctor": "allocator.cli.doctor",
    "agent": "allocator.cli.agent",
    "serve": "allocator.cli.serve",
    "demo": "allocator.cli.demo",
    "completion": "allocator.cli.completion",
}
COMMAND_MODULES = tuple(COMMANDS.values())

_LABELS = {
    2: "error",
    3: "conflict",
    4: "store unavailable",
    5: "permission denied",
    6: "not found",
}
#: The ``error`` of a JSON error object, by exit code (``docs/schemas/error.schema.json``).
ERROR_NAMES = {
    1: "internal_error",
    2: "invalid_input",
    3: "conflict",
    4: "store_unavailable",
    5: "permission_denied",
    6: "not_found",
    130: "interrupted",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser: every command registered, or ``only`` that one.

    A command run registers just itself: importing the other eleven
    modules and building their parsers would be a fifth of a quick
    command's run time.
    """
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
    for name in [COMMANDS[only]] if only in COMMANDS else COMMAND_MODULES:
        importlib.import_module(name).register(commands)
    return parser


@functools.cache
def parser_for(command: str | None) -> argparse.ArgumentParser:
    """:func:`build_parser` for ``command``, built once per process.

    A command server builds each command's parser before it forks its
    workers; a command run in its own process builds just its own.
    """
    return build_parser(only=command)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the process exit code (never raises for bad input).

    Under ``-o json`` (or ``yaml``) everything on stderr is JSON, one object a
    line: notes and warnings, and an error as :func:`error_document` says,
    even when the arguments themselves are what is wrong.
    """
    words = list(sys.argv[1:] if argv is None else argv)
    structured = machine_output(words)
    previous = set_structured_stderr(structured)
    try:
        return _run_command(words)
    except BadRecord as exc:  # damaged data in the store, not a bug here
        message = f"{exc}; rewrite it (for the policy: `allocator policy apply FILE`)"
        _fail("error", message, exc.exit_code, structured, name="bad_record")
        return exc.exit_code
    except AllocatorError as exc:
        _fail(_LABELS.get(exc.exit_code, "internal error"), str(exc), exc.exit_code, structured)
        return exc.exit_code
    except KeyboardInterrupt:
        _fail("error", "interrupted", 130, structured)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:
        if os.environ.get("ALLOCATOR_DEBUG"):
            raise
        message = f"{type(exc).__name__}: {exc} (set ALLOCATOR_DEBUG=1 for a traceback)"
        _fail("internal error", message, EXIT_INTERNAL, structured)
        return EXIT_INTERNAL
    finally:
        set_structured_stderr(previous)


def _run_command(words: list[str]) -> int:
    chosen = command_word(words)
    command_argv = None
    if chosen in ("run", "submit"):  # its command follows `--`, options and all
        from allocator.cli.run import split_command

        words, command_argv = split_command(words)
    args = parser_for(chosen).parse_args(words)
    if command_argv is not None:
        args.command_argv = command_argv
    code: int = args.handler(args)
    if code == 0 and getattr(args, "command", None) not in _WARN_THEMSELVES:
        warn_of_secrets_in_argv(args)  # after the one line a failure would print
    return code


#: Commands that warn of a password in --store themselves, once they have checked the URL:
#: they run for long (or, for completion, inside a shell's prompt).
_WARN_THEMSELVES = frozenset({"agent", "serve", "completion"})


def error_document(exit_code: int, message: str, name: str | None = None) -> dict[str, Any]:
    """The JSON object an error is under ``-o json``: ``{"error", "exit_code", "message"}``."""
    from allocator.store.credentials import redact

    return {
        "error": name or ERROR_NAMES.get(exit_code, "internal_error"),
        "exit_code": exit_code,
        "message": one_line(redact(message)),
    }


def _fail(label: str, message: str, code: int, structured: bool, name: str | None = None) -> None:
    from allocator.store.credentials import redact

    if structured:
        line = json.dumps(error_document(code, message, name), sort_keys=True)
        sys.stderr.write(line + "\n")
    else:
        sys.stderr.write(f"allocator: {label}: {one_line(redact(message))}\n")


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
