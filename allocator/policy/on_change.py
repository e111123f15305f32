"""The ``on_change`` kind: what a change of assignment does to a job's running workers.

``restart`` (stop and start again), ``none``, or ``signal:<SIGNAME>`` for a
program that reloads its devices on a signal. Only signals a program handles
to reload or stop are accepted: a stop signal (SIGTSTP) would suspend the
workers with their GPUs held, SIGCHLD and real-time signals are ignored by
default, and fault signals (SIGSEGV) make a worker look like it crashed.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

from allocator.policy.yamlspec.kinds import Scalar, suggest

if TYPE_CHECKING:
    from yaml.nodes import Node

__all__ = ["RELOAD_SIGNALS", "OnChange"]

_UNHANDLEABLE_SIGNALS = frozenset({"SIGKILL", "SIGSTOP"})
#: Signals ``on_change`` may send: what programs handle to reload or stop.
RELOAD_SIGNALS = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGWINCH")
_RELOAD_WORDS = "restart, or signal:SIGHUP, SIGUSR1, SIGUSR2, SIGINT, SIGTERM, SIGQUIT or SIGWINCH"
_STOPS = "a stop signal would suspend the workers, holding their GPUs"
_IGNORED = "programs ignore it by default"
_FAULT = "it reports a fault, so the worker would look crashed"
_SIGNAL_TROUBLE = {
    "SIGTSTP": _STOPS,
    "SIGTTIN": _STOPS,
    "SIGTTOU": _STOPS,
    "SIGCHLD": _IGNORED,
    "SIGCONT": _IGNORED,
    "SIGURG": _IGNORED,
    "SIGRTMIN": "real-time signals are ignored by default and numbered differently per system",
    "SIGRTMAX": "real-time signals are ignored by default and numbered differently per system",
    **dict.fromkeys(
        ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT", "SIGIOT", "SIGTRAP", "SIGSYS"),
        _FAULT,
    ),
}


class OnChange(Scalar):
    """``restart``, ``none`` or ``signal:<SIGNAME>`` for a signal a program handles to reload."""

    expected = "restart, none or signal:<SIGNAME>"
    wants_text = True

    def problem(self, value: Any, node: Node) -> str | None:
        """Refuse unknown words and signals that cannot tell a worker its GPUs changed."""
        if not isinstance(value, str):
            return self.wrong_type(value, node)
        if value in ("restart", "none"):
            return None
        if not value.startswith("signal:"):
            return self.wrong_type(value, node) + suggest(value, ("restart", "none"))
        name = value.removeprefix("signal:")
        if name in RELOAD_SIGNALS:
            return None
        if name in _UNHANDLEABLE_SIGNALS:
            return f"{name} cannot be handled by a worker; use restart"
        if name.startswith("SIG") and name in signal.Signals.__members__:
            why = _SIGNAL_TROUBLE.get(name, "it is not how a program is told to reload or stop")
            return f"{name} cannot tell a worker its GPUs changed: {why}; use {_RELOAD_WORDS}"
        guess = f"SIG{name.upper()}"
        if guess in RELOAD_SIGNALS:
            return f"unknown signal {name!r} (did you mean 'signal:{guess}'?)"
        return f"unknown signal {name!r} (e.g. signal:SIGHUP, signal:SIGUSR1)"

    def schema(self) -> dict[str, Any]:
        """A string: restart, none, or signal: and an accepted signal name."""
        names = "|".join(RELOAD_SIGNALS)
        return {"type": "string", "pattern": f"^(restart|none|signal:({names}))$"}
