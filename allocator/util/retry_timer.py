"""When to try a store again: capped, jittered exponential backoff.

Shared by the agent's store link and step guard and by the web server's
watcher, which must not import the agent.
"""

from __future__ import annotations

__all__ = ["RetryTimer"]


class RetryTimer:
    """When to try the store again: capped, jittered exponential backoff (tenacity's).

    The backoff is forgiven only after the link has stayed up for
    ``healthy_seconds`` (the cap, by default), not on every successful
    connect: an endpoint that accepts connections and then fails every time
    must not be hammered at the base rate forever.
    """

    def __init__(
        self, cap_seconds: float, base_seconds: float = 0.5, healthy_seconds: float | None = None
    ) -> None:
        from tenacity import wait_random_exponential

        self.cap_seconds = cap_seconds
        self.healthy_seconds = cap_seconds if healthy_seconds is None else healthy_seconds
        self._wait = wait_random_exponential(multiplier=base_seconds, max=cap_seconds)
        self.failures = 0
        self._up_since: float | None = None

    def connected(self, now: float) -> None:
        """The link came up at ``now``; the backoff resets once it has stayed up long enough."""
        self._up_since = now

    def failed(self, now: float) -> float:
        """Record a failure at ``now``; return the time of the next attempt."""
        from tenacity import RetryCallState

        if self._up_since is not None and now - self._up_since >= self.healthy_seconds:
            self.failures = 0
        self._up_since = None
        self.failures += 1
        state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        state.attempt_number = self.failures
        return now + float(self._wait(state))

    def failed_slowly(self, now: float) -> float:
        """Record a failure that retrying soon cannot fix (a refused permission): wait the cap."""
        self.failed(now)
        return now + self.cap_seconds
