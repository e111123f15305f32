"""Bounded retries of an operation that can lose a race (a compare that failed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from allocator.errors import CasConflict, ConflictError

__all__ = ["with_retries"]

T = TypeVar("T")


def with_retries(operation: Callable[[], T], what: str, attempts: int) -> T:
    """Run ``operation``; after a lost race (``CasConflict``) retry it, ``attempts`` in all.

    Jittered exponential waits between attempts; the last loss becomes a
    ``ConflictError`` (exit 3) saying nothing was written.
    """
    # The first attempt needs no retry machinery: tenacity (and what it loads,
    # a tenth of a one-shot command's start-up) is imported only after a lost race.
    try:
        return operation()
    except CasConflict as exc:
        lost = [exc]

    def attempt() -> T:
        if lost:  # the first attempt, already made: tenacity waits, then retries
            raise lost.pop()
        return operation()

    from tenacity import (
        Retrying,
        retry_if_exception_type,
        stop_after_attempt,
        wait_random_exponential,
    )

    retrying = Retrying(
        retry=retry_if_exception_type(CasConflict),
        stop=stop_after_attempt(attempts),
        wait=wait_random_exponential(multiplier=0.01, max=0.2),
        reraise=True,
    )
    try:
        return retrying(attempt)
    except CasConflict as exc:
        raise ConflictError(
            f"{what}: the store changed under us {attempts} times in a row "
            f"({', '.join(exc.keys) or 'compared keys'}); nothing was written, try again"
        ) from exc
