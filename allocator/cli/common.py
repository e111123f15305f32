"""What every command shares: opening the store and the options that select it."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from allocator.errors import InvalidInput

if TYPE_CHECKING:
    from allocator.control.client import Allocator

__all__ = [
    "CliArgumentParser",
    "add_common_options",
    "add_store_options",
    "add_words_command",
    "help_width",
    "machine_output",
    "note",
    "note_waiting",
    "open_allocator",
    "output_format",
    "plain_text",
    "queued_notes",
    "set_structured_stderr",
    "warn",
    "warn_of_secrets_in_argv",
]

#: Under -o json/yaml, stderr carries JSON lines too (see :func:`set_structured_stderr`).
_STDERR = {"structured": False}


class CliArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and exit 2 via ``InvalidInput``."""

    def error(self, message: str) -> None:  # type: ignore[override]
        """Raise instead of printing usage: the CLI prints one clear line."""
        raise InvalidInput(f"{self.prog}: {message} (see `{self.prog} --help`)")

    def format_help(self) -> str:
        """The help, its description (a module docstring) with the markup taken out."""
        if self.description:
            self.description = plain_text(self.description)
        return super().format_help()

    def _get_formatter(self) -> argparse.HelpFormatter:
        # argparse makes a formatter for every argument added, and each asks shutil
        # for the terminal's width: importing shutil costs every command milliseconds.
        return self.formatter_class(prog=self.prog, width=help_width())  # type: ignore[call-arg]


def plain_text(doc: str) -> str:
    """A docstring as a person reads it in ``--help``: ````x```` as `x`, ``:data:`X``` as X."""
    import re

    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc)
    return text.replace("``", "`")


def help_width() -> int:
    """The width ``--help`` wraps at: ``$COLUMNS``, else the terminal's, else 80 (less 2).

    What argparse computes with ``shutil.get_terminal_size``, without importing shutil.
    """
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return (columns or 80) - 2


def add_common_options(parser: argparse.ArgumentParser, *, store: bool = True) -> None:
    """``--store``, ``--prefix`` and ``-o``; accepted before or after the command.

    ``store=False``: only ``-o``, for a command that reads no store.
    """
    if store:
        add_store_options(parser)
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "json", "yaml"),
        default=argparse.SUPPRESS,
        help="output format (default: table)",
    )


def warn_of_secrets_in_argv(args: argparse.Namespace) -> None:
    """A password in ``--store`` is in every user's ``ps``: say so (masked everywhere else)."""
    explicit = getattr(args, "store", None)
    if not explicit:
        return
    from allocator.store.urls import url_secrets

    if url_secrets(explicit):
        warn(
            "--store carries a password or token, which every user of this machine can read "
            "in `ps`; set ALLOCATOR_STORE, or ETCDCTL_PASSWORD/CONSUL_HTTP_TOKEN_FILE, instead"
        )


def add_store_options(parser: argparse.ArgumentParser) -> None:
    """``--store`` and ``--prefix``."""
    parser.add_argument(
        "--store",
        default=argparse.SUPPRESS,
        help="store URL: sqlite:///PATH, etcd://H:P[,H:P], consul://H:P, memory:// "
        "(a password here shows in ps: put it in $ALLOCATOR_STORE or ETCDCTL_PASSWORD) "
        "(default: $ALLOCATOR_STORE, else sqlite under ~/.local/state/allocator)",
    )
    parser.add_argument(
        "--prefix",
        default=argparse.SUPPRESS,
        help="key prefix in the store (default: $ALLOCATOR_PREFIX or /allocator)",
    )


def add_words_command(
    commands: Any, name: str, handler: Callable[[argparse.Namespace], int], **texts: str
) -> argparse.ArgumentParser:
    """Register a ``key=value`` command (``set``, ``get``, ...) with the common options."""
    parser: argparse.ArgumentParser = commands.add_parser(name, **texts)
    parser.add_argument("words", nargs="*", metavar="key=value")
    add_common_options(parser)
    parser.set_defaults(handler=handler)
    return parser


def output_format(args: argparse.Namespace) -> str:
    """The chosen ``-o`` format."""
    return str(getattr(args, "output", "table"))


def open_allocator(args: argparse.Namespace, *, create: bool = False) -> Allocator:
    """Open the store the options select and wrap it in an :class:`Allocator`.

    ``create``: the command is about to create the store if it does not exist
    (``policy apply``); every other command reads a missing SQLite store as
    exit 4 naming the path, and creates nothing.
    """
    import os

    from allocator.control.client import Allocator
    from allocator.records.keys import DEFAULT_PREFIX, validate_prefix
    from allocator.store import open_store, resolve_store_url

    url = resolve_store_url(getattr(args, "store", None))
    prefix = validate_prefix(
        getattr(args, "prefix", None) or os.environ.get("ALLOCATOR_PREFIX") or DEFAULT_PREFIX
    )
    # A command makes a few calls and exits: the backend that starts fastest.
    store = open_store(url, create=create)
    return Allocator(store, prefix=prefix, on_bad_record=_bad_record_noter())


def _bad_record_noter() -> Callable[[Exception], None]:
    """A note on stderr per bad record the command skipped, each key once."""
    seen: set[str] = set()

    def noter(bad: Exception) -> None:
        key = str(getattr(bad, "key", ""))
        if key not in seen:
            seen.add(key)
            note(f"skipped {bad}")

    return noter


def machine_output(words: Sequence[str]) -> bool:
    """Whether ``words`` ask for ``-o json`` or ``-o yaml`` (the last ``-o`` wins, as in argparse).

    Read from the words themselves, so an error in parsing them is still
    reported the way the caller asked for.
    """
    chosen = None
    for index, word in enumerate(words):
        if word == "--":
            break
        if word in ("-o", "--output") and index + 1 < len(words):
            chosen = words[index + 1]
        elif word.startswith("--output="):
            chosen = word.removeprefix("--output=")
        elif word.startswith("-o") and not word.startswith("-o="):
            chosen = word[2:] or chosen
    return chosen in ("json", "yaml")


def set_structured_stderr(structured: bool) -> bool:
    """Make :func:`note` and :func:`warn` write JSON lines (``{"note": ...}``) or text.

    Returns the previous setting (``demo`` runs commands inside a command).
    """
    previous = _STDERR["structured"]
    _STDERR["structured"] = structured
    return previous


def note(message: str) -> None:
    """A one-line remark on stderr that does not change the exit code (secrets masked)."""
    _remark("note", message)


def note_waiting(why: str) -> None:
    """Why a ``--wait`` request waits in the queue (told on joining it and as that changes)."""
    note(f"waiting: {why}")


def queued_notes() -> Callable[[str], None]:
    """Why a ``run`` waits in the queue: srun's line on joining, then one per change of reason."""
    told: list[str] = []

    def tell(why: str) -> None:
        note(f"{'waiting' if told else 'queued and waiting for resources'}: {why}")
        told.append(why)

    return tell


def warn(message: str) -> None:
    """A warning on stderr: the command goes on, but something looks wrong."""
    _remark("warning", message)


def _remark(kind: str, message: str) -> None:
    import json

    from allocator.store.credentials import redact
    from allocator.util.printable import one_line

    text = one_line(redact(message))
    if _STDERR["structured"]:
        sys.stderr.write(json.dumps({kind: text}) + "\n")
    else:
        sys.stderr.write(f"allocator: {kind}: {text}\n")
