"""The agent's life cycle: signals, reload on SIGHUP, and the orderly (or not) end.

A part of :class:`allocator.agent.daemon.Agent`, kept apart to keep the loop's
module small: what SIGTERM, SIGINT and SIGHUP do, what a reload may change
while the agent runs, and what is stopped, kept and withdrawn at the end.
"""

from __future__ import annotations

import signal
from dataclasses import asdict, replace
from types import FrameType
from typing import TYPE_CHECKING

from allocator.errors import AllocatorError

if TYPE_CHECKING:
    from collections.abc import Callable

    from allocator.agent.config import AgentConfig
    from allocator.agent.gpu_care.care import GpuCare
    from allocator.agent.gpu_care.observe import Observer
    from allocator.agent.log import DecisionLog
    from allocator.agent.notify import Notifier
    from allocator.agent.processes.supervisor import Supervisor
    from allocator.agent.step_guard import StepGuard
    from allocator.agent.sync.store_sync import StoreSync

__all__ = ["WITHDRAW_SECONDS", "Lifecycle"]

#: On shutdown, how long the link may take to revoke the lease and drop the
#: worker records; a store that does not answer does not hold the agent up
#: (the lease then expires on its own).
WITHDRAW_SECONDS = 2.0


class Lifecycle:
    """Signals, reload and shutdown: a part of :class:`~allocator.agent.daemon.Agent`."""

    config: AgentConfig
    reload_config: Callable[[], AgentConfig] | None
    log: DecisionLog
    sync: StoreSync
    supervisor: Supervisor
    care: GpuCare
    notifier: Notifier
    observer: Observer
    clock: Callable[[], float]
    stop_requested: bool
    reload_requested: bool
    reconciled: bool

    guard: StepGuard

    def _read_inventory(self) -> None:  # the loop's (it re-reads NVML or the policy's count)
        raise NotImplementedError

    def _offer(self) -> None:  # the loop's (it hands the link what to publish)
        raise NotImplementedError

    # --- signals, reload, shutdown -----------------------------------------------

    def _install_signal_handlers(self) -> None:
        def stop(signum: int, _frame: FrameType | None) -> None:
            self.stop_requested = True

        def reload(signum: int, _frame: FrameType | None) -> None:
            self.reload_requested = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGHUP, reload)

    def _reload(self) -> None:
        """SIGHUP: re-read settings, inventory and the store state; workers are left alone."""
        self.reload_requested = False
        self._reload_settings()
        self._read_inventory()
        inventory = self.care.inventory
        self.log("reload", {"inventory": inventory.source, "gpus": len(inventory.gpus)})
        self.sync.link.resync()

    def _reload_settings(self) -> None:
        if self.reload_config is None:
            return
        try:
            new = self.reload_config()
        except AllocatorError as exc:  # a typo in the file must not take the agent down
            self.log("reload-refused", {"error": str(exc)})
            return
        fixed = ("host", "store", "prefix", "state_dir", "log_dir")
        ignored = [name for name in fixed if getattr(new, name) != getattr(self.config, name)]
        if ignored:
            self.log("reload-needs-restart", {"settings": ignored})
            new = replace(new, **{name: getattr(self.config, name) for name in ignored})
        self.config = new
        self.log.fmt = new.log_format
        self.sync.link.reconfigure(new)
        self.log("settings", {k: str(v) for k, v in asdict(new).items()})

    def _shutdown(self, orderly: bool) -> None:
        """Stop workers (orderly stop only, unless told to keep them), then withdraw."""
        self.notifier.stopping()
        keep = self.config.keep_workers_on_exit or not orderly
        jobs = sorted(self.supervisor.views())
        if not orderly:
            self.log("crashed-keeping-workers", {"jobs": jobs})
        elif keep:
            self.log("exit-keeping-workers", {"jobs": jobs})
        else:
            self.log("stopping-workers", {"jobs": jobs})
            self.supervisor.stop_all()
            self.care.mps.stop_all(self.clock())
        if keep and orderly and self.reconciled:
            self.guard.run("publish", self._offer)
        if not self.sync.link.close(keep_worker_records=keep, timeout=WITHDRAW_SECONDS):
            self.log(
                "withdraw-skipped",
                {
                    "reason": f"the store did not answer within {WITHDRAW_SECONDS:g} s; "
                    "the lease expires on its own"
                },
            )
        self.care.close()
        self.observer.close()
        self.notifier.close()
        self.log("stopped", {})
