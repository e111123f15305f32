"""YAML text to a node tree: the only module of the policy package importing PyYAML.

The text is composed, not loaded: nodes keep their line numbers, and
duplicate keys are still visible (a loaded dict has already dropped them).
Plain scalars are resolved by :mod:`allocator.policy.yamlspec.scalars` (the forms
YAML 1.1, YAML 1.2 and JSON read alike), not by PyYAML's YAML 1.1 rules;
other tags go through PyYAML's safe constructor, one node at a time, so no
tag can build an arbitrary object.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import Node, ScalarNode

from allocator.errors import PolicyError
from allocator.policy.yamlspec.reader import MERGE_TAG
from allocator.policy.yamlspec.scalars import plain_tag, read_tagged
from allocator.util.printable import printable

__all__ = ["compose", "dump_yaml"]

# libyaml's parser when PyYAML was built with it (much faster), else pure Python
_BASE: type[yaml.SafeLoader] | type[yaml.CSafeLoader] = getattr(
    yaml, "CSafeLoader", yaml.SafeLoader
)


class _Loader(_BASE):  # type: ignore[valid-type,misc]
    """PyYAML's safe loader, with plain scalars resolved by our rules, not YAML 1.1's."""

    def resolve(self, kind: type[Node], value: str, implicit: tuple[bool, bool]) -> str:
        """The tag of a node; a plain, untagged scalar gets :func:`plain_tag`'s."""
        if kind is ScalarNode and implicit[0]:
            return MERGE_TAG if value == "<<" else plain_tag(value)
        tag: str = super().resolve(kind, value, implicit)
        return tag


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, quoting every string the loader would not read as text."""

    def resolve(self, kind: type[Node], value: str, implicit: tuple[bool, bool]) -> str:
        """The tag a scalar would get when read back: the loader's rules, not YAML 1.1's."""
        if kind is ScalarNode and implicit[0]:
            return MERGE_TAG if value == "<<" else plain_tag(value)
        tag: str = super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]
        return tag


def dump_yaml(data: Any) -> str:
    """``data`` as block-style YAML (keys sorted) that every YAML reader reads back the same.

    ``yaml.safe_dump`` writes the string ``"1e3"`` plain, which YAML 1.2 reads
    as a number; this quotes whatever the policy loader would not read as text.
    """
    return yaml.dump(data, Dumper=_Dumper, sort_keys=True, default_flow_style=False)


def compose(text: str, source: str) -> tuple[Node | None, Callable[[Node], Any]]:
    """Return the root node of ``text`` (``None`` when empty) and a scalar constructor.

    The constructor raises ``ValueError`` with a readable reason for scalars
    it cannot turn into a value. Syntax errors raise ``PolicyError`` with
    the line.
    """
    try:
        root = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = None if mark is None else mark.line + 1
        problem = ", ".join(part for part in (exc.context, exc.problem) if part) or "unreadable"
        raise PolicyError(f"invalid YAML: {printable(problem)}", file=source, line=line) from exc
    except yaml.reader.ReaderError as exc:
        line = _line_at(text, exc.position)
        code = exc.character if isinstance(exc.character, int) else ord(exc.character[:1] or "\0")
        reason = f"invalid YAML: character #x{code:04x} is not allowed ({exc.reason})"
        raise PolicyError(reason, file=source, line=line) from exc
    except yaml.YAMLError as exc:
        raise PolicyError(f"invalid YAML: {printable(str(exc))}", file=source) from exc
    except UnicodeEncodeError as exc:
        line = _line_at(text, exc.start)
        raise PolicyError("the text is not valid Unicode", file=source, line=line) from exc
    except RecursionError as exc:
        raise PolicyError("invalid YAML: nested too deeply", file=source) from exc
    return root, _scalar_constructor()


def _is_scalar(node: Node) -> bool:
    return isinstance(node, ScalarNode)


def _line_at(text: str, position: int) -> int:
    return text.count("\n", 0, max(position, 0)) + 1


def _scalar_constructor() -> Callable[[Node], Any]:
    constructor = SafeConstructor()

    def construct(node: Node) -> Any:
        if _is_scalar(node):
            try:
                return read_tagged(node.tag, node.value)
            except LookupError:
                pass  # not a core tag: PyYAML's safe constructor knows it, or refuses it
        try:
            return constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or "cannot read this value"
            raise ValueError(problem) from exc
        except (ValueError, TypeError, OverflowError) as exc:
            kind = node.tag.rsplit(":", 1)[-1]
            raise ValueError(f"cannot read {node.value!r} as {kind}: {exc}") from exc

    return construct
