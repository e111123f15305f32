"""Who may change or release an assignment someone holds (pure: no I/O).

An assignment with a holder (see :mod:`allocator.control.holder`) is that
holder's: a ``set`` that rewrites it or a ``release`` that removes it is
made by the holder, by an operator of a team the holder is a member of
(the team's ``operators``), or by a subject the policy names among its
``operators``. Records written before holders existed (an empty holder)
are anyone's, as they were.

This binds every client that goes through allocator; where it binds the
store's other users too is the store's business (docs/queue.md's trust
model).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from allocator.errors import NotPermitted
from allocator.policy.model import Policy
from allocator.records.types import Assignment

__all__ = ["Standing", "check_owner", "may_change"]


@dataclass(frozen=True)
class Standing:
    """Who writes, as a write's checks see it under ``rules``: read by the client first.

    ``groups`` are the holder's unix groups (empty unless ``rules`` names
    one) and ``charged`` the quota subjects a new assignment is charged to.
    """

    holder: str
    acts_for_policy: bool
    groups: tuple[str, ...]
    charged: tuple[str, ...]
    rules: Policy

    def check_owners(self, held: Iterable[Assignment | None]) -> None:
        """``NotPermitted`` unless this holder may change or release each of ``held``."""
        if self.acts_for_policy:
            return
        for one in held:
            if one is not None and one.holder:
                what = f"job {one.job!r} on {one.host}"
                check_owner(self.rules, self.holder, self.groups, one.holder, what)


def may_change(policy: Policy, acting: str, groups: Sequence[str], holder: str) -> bool:
    """Whether ``acting`` (with its unix ``groups``) may change what ``holder`` holds."""
    if not holder or holder == acting:
        return True
    mine = {f"user:{acting}", *(f"unix:{g}" for g in groups)}
    for team in policy.teams.values():
        if f"team:{team.name}" in policy.operators and acting in team.members:
            mine.add(f"team:{team.name}")
        if acting in team.operators and holder in team.members:
            return True
    return bool(mine.intersection(policy.operators))


def check_owner(policy: Policy, acting: str, groups: Sequence[str], holder: str, what: str) -> None:
    """``NotPermitted`` naming the holder unless ``acting`` may change ``what`` (job@host)."""
    if may_change(policy, acting, groups, holder):
        return
    raise NotPermitted(
        f"{what} is held by {holder}: only {holder}, an operator of a team of theirs, "
        f"or one of the policy's operators may change or release it (you are {acting})"
    )
