"""The agent's life cycle: signals, reload on SIGHUP, and the orderly (or not) end.

A collaborator the loop's :class:`allocator.agent.daemon.Agent` makes and
holds: what SIGTERM, SIGINT and SIGHUP do, what a reload may change while the
agent runs, and what is stopped, kept and withdrawn at the end.
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
    """Signals, reload and shutdown of one agent: a part the loop's Agent holds and calls.

    The signal handlers only raise flags (:attr:`stop_requested`,
    :attr:`reload_requested`) that the loop reads between steps.
    """

    def __init__(
        self,
        *,
        reload_config: Callable[[], AgentConfig] | None,
        log: DecisionLog,
        sync: StoreSync,
        supervisor: Supervisor,
        care: GpuCare,
        notifier: Notifier,
        observer: Observer,
        guard: StepGuard,
        clock: Callable[[], float],
        read_inventory: Callable[[], None],
        offer: Callable[[], None],
    ) -> None:
        self._reload_config = reload_config
        self._log = log
        self._sync = sync
        self._supervisor = supervisor
        self._care = care
        self._notifier = notifier
        self._observer = observer
        self._guard = guard
        self._clock = clock
        self._read_inventory = read_inventory  # the loop's: NVML or the policy's count
        self._offer = offer  # the loop's: hands the link what to publish
        self.stop_requested = False
        self.reload_requested = False

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT ask for an orderly stop, SIGHUP for a reload."""

        def stop(signum: int, _frame: FrameType | None) -> None:
            self.stop_requested = True

        def reload(signum: int, _frame: FrameType | None) -> None:
            self.reload_requested = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGHUP, reload)

    def reload(self, config: AgentConfig) -> AgentConfig:
        """SIGHUP: re-read settings, inventory and the store state; workers are left alone.

        Returns the settings in force from now on (``config`` when the file was refused).
        """
        self.reload_requested = False
        config = self._reload_settings(config)
        self._read_inventory()
        inventory = self._care.inventory
        self._log("reload", {"inventory": inventory.source, "gpus": len(inventory.gpus)})
        self._sync.link.resync()
        return config

    def _reload_settings(self, config: AgentConfig) -> AgentConfig:
        if self._reload_config is None:
            return config
        try:
            new = self._reload_config()
        except AllocatorError as exc:  # a typo in the file must not take the agent down
            self._log("reload-refused", {"error": str(exc)})
            return config
        fixed = ("host", "store", "prefix", "state_dir", "log_dir")
        ignored = [name for name in fixed if getattr(new, name) != getattr(config, name)]
        if ignored:
            self._log("reload-needs-restart", {"settings": ignored})
            new = replace(new, **{name: getattr(config, name) for name in ignored})
        self._log.fmt = new.log_format
        self._sync.link.reconfigure(new)
        self._log("settings", {k: str(v) for k, v in asdict(new).items()})
        return new

    def shutdown(self, config: AgentConfig, *, orderly: bool, reconciled: bool) -> None:
        """Stop workers (orderly stop only, unless told to keep them), then withdraw.

        ``reconciled``: the agent knows what it runs, so its kept workers are published.
        """
        self._notifier.stopping()
        keep = config.keep_workers_on_exit or not orderly
        jobs = sorted(self._supervisor.views())
        if not orderly:
            self._log("crashed-keeping-workers", {"jobs": jobs})
        elif keep:
            self._log("exit-keeping-workers", {"jobs": jobs})
        else:
            self._log("stopping-workers", {"jobs": jobs})
            self._supervisor.stop_all()
            self._care.mps.stop_all(self._clock())
        if keep and orderly and reconciled:
            self._guard.run("publish", self._offer)
        if not self._sync.link.close(keep_worker_records=keep, timeout=WITHDRAW_SECONDS):
            self._log(
                "withdraw-skipped",
                {
                    "reason": f"the store did not answer within {WITHDRAW_SECONDS:g} s; "
                    "the lease expires on its own"
                },
            )
        self._care.close()
        self._observer.close()
        self._notifier.close()
        self._log("stopped", {})
