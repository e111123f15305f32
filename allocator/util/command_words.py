"""Which command a command line runs: the first word that is not an option.

Read twice before any parser exists: by the CLI, to build the parser of that
command alone, and by the console script's door, to tell a command its
server runs from one it never does. So it imports nothing.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["VALUE_OPTIONS", "command_word"]

#: Options taking a value in the next word, before or after the command.
VALUE_OPTIONS = frozenset({"--store", "--prefix", "-o", "--output"})


def command_word(words: Sequence[str]) -> str | None:
    """The command ``words`` run (``set`` in ``--store URL set job=a``), if any.

    ``None`` when an option that stops the run (``--help``, ``--version``)
    comes first, or nothing looks like a command: the full parser then
    prints the help, or says which commands there are.
    """
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word in VALUE_OPTIONS:
            skip = True
        elif word == "--" or word in ("-h", "--help", "--version"):
            return None
        elif not word.startswith("-"):
            return word
    return None
