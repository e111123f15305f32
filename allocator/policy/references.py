"""Kubernetes-style ``$(NAME)`` references in a job's command (pure).

The agent expands them (:mod:`allocator.agent.planning.command_line`) from
the worker's environment; ``policy validate`` warns about a name no worker
gets (:mod:`allocator.policy.lint`), since it is left as written. ``$$`` is
one ``$``, so ``$$(NAME)`` is the text ``$(NAME)``; a ``$`` not followed by
``(`` and a ``$(`` with no closing ``)`` are text too.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

__all__ = ["expand_references", "referenced_names"]


def _pieces(argument: str) -> Iterator[tuple[str, str | None]]:
    """``argument`` as (text, None) and (written reference, name) pieces, in order."""
    index, end = 0, len(argument)
    while index < end:
        dollar = argument.find("$", index)
        if dollar < 0 or dollar + 1 >= end:
            yield argument[index:], None
            return
        yield argument[index:dollar], None
        nxt = argument[dollar + 1]
        if nxt == "$":
            yield "$", None
            index = dollar + 2
        elif nxt != "(":
            yield "$", None
            index = dollar + 1
        else:
            close = argument.find(")", dollar + 2)
            if close < 0:  # no closing parenthesis: the rest is text
                yield argument[dollar:], None
                return
            yield argument[dollar : close + 1], argument[dollar + 2 : close]
            index = close + 1


def expand_references(argument: str, env: Mapping[str, str]) -> str:
    """``argument`` with every ``$(NAME)`` that ``env`` defines replaced (``$$`` is ``$``)."""
    if "$" not in argument:
        return argument
    return "".join(
        text if name is None else env.get(name, text) for text, name in _pieces(argument)
    )


def referenced_names(argument: str) -> list[str]:
    """The names ``argument`` refers to as ``$(NAME)``, in order (escaped ones are text)."""
    if "$" not in argument:
        return []
    return [name for _, name in _pieces(argument) if name is not None]
