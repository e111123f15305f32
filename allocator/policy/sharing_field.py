"""The ``sharing`` field of a pool: a word (``exclusive``, ``shared``) or ``{mode, slots}``.

``shared`` is the old spelling of unlimited time-slicing; it still loads (as
``time-slice`` without a limit) and ``policy validate`` warns about it. Every
mode but ``exclusive`` needs ``slots``: how many jobs one GPU holds at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from allocator.policy.model import Sharing
from allocator.policy.yamlspec.kinds import Enum, Int
from allocator.policy.yamlspec.reader import INVALID, Reader, join, kind_of
from allocator.policy.yamlspec.structures import Field, Record
from allocator.records.fields import MAX_SLOTS

if TYPE_CHECKING:
    from yaml.nodes import Node

__all__ = ["SHARED", "SharingKind"]

#: What ``sharing: shared`` means: time-slicing without a limit.
SHARED = Sharing("time-slice", None)
_WORDS = {"exclusive": Sharing(), "shared": SHARED}
_SLOTS_WHY = f"{MAX_SLOTS} jobs on one GPU; more only thrash its memory"

_MAPPING = Record(
    Sharing,
    (
        Field(
            "mode",
            Enum("exclusive", "time-slice", "mps"),
            "exclusive: one job per GPU; time-slice: up to slots jobs per GPU, taking turns; "
            "mps: up to slots jobs per GPU through an NVIDIA MPS control daemon, each limited "
            "to its share of the SMs and memory.",
            required=True,
        ),
        Field(
            "slots",
            Int(minimum=1, maximum=MAX_SLOTS, why=_SLOTS_WHY),
            "Jobs one GPU holds at once (a job asking slots=K takes K of them); required for "
            "time-slice and mps.",
        ),
    ),
    description="A sharing mode and the slots per GPU.",
)


class SharingKind:
    """Reads, describes and writes a pool's :class:`~allocator.policy.model.Sharing`."""

    def read(self, node: Node, path: str, r: Reader) -> Any:
        """A :class:`Sharing` from a word or a mapping, or ``INVALID`` after reporting why."""
        if kind_of(node) != "mapping":
            word = Enum(*_WORDS).read(node, path, r)
            return INVALID if word is INVALID else _WORDS[word]
        values = _MAPPING.read_values(node, path, r)
        if values is INVALID or "mode" not in values:
            return INVALID
        mode, slots = values["mode"], values.get("slots")
        if mode == "exclusive" and slots is not None:
            r.error_on(join(path, "slots"), "slots is only valid with mode time-slice or mps")
            return INVALID
        if mode != "exclusive" and slots is None:
            inside = f"{path}."
            if not any((e.field or "").startswith(inside) for e in r.errors):  # a typo said it
                r.error_on(path, f"mode {mode} needs slots: how many jobs one GPU holds at once")
            return INVALID
        return Sharing(mode, slots)

    def schema(self) -> dict[str, Any]:
        """A word, or an object whose slots are required unless the mode is exclusive."""
        mapping = _MAPPING.schema()
        mapping["allOf"] = [
            {
                "if": {"properties": {"mode": {"const": "exclusive"}}},
                "then": {"properties": {"slots": {"type": "null"}}},
                "else": {"required": ["slots"], "properties": {"slots": {"type": "integer"}}},
            }
        ]
        word = {
            "type": "string",
            "enum": list(_WORDS),
            "description": "exclusive; or shared (deprecated: time-slice without a limit)",
        }
        return {"anyOf": [word, mapping]}

    def dump(self, value: Any) -> Any:
        """``exclusive``, ``shared``, or ``{mode, slots}``."""
        for word, meaning in _WORDS.items():
            if value == meaning:
                return word
        return {"mode": value.mode, "slots": value.slots}
