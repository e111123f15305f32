"""The fleet's mean GPU utilisation, from the counts agents keep (``counts/<host>``).

Each agent reports its host's mean utilisation, rounded and changed at most
every few minutes (:mod:`allocator.agent.sync.utilisation_report`).
:class:`UtilisationTally` keeps each host's value and GPU count, and running
sums of both, so the series' sample is one division however large the
fleet, and a host's change costs one decode.
"""

from __future__ import annotations

import msgspec

from allocator.records.host_counts import HostCounts

__all__ = ["UtilisationTally"]

_DECODER = msgspec.json.Decoder(HostCounts)


class UtilisationTally:
    """Each reporting host's (utilisation, GPUs) and their weighted sums (not thread-safe)."""

    def __init__(self) -> None:
        self._hosts: dict[str, tuple[int, int]] = {}
        self._weighted = 0  # sum of utilisation x GPUs
        self._gpus = 0

    def put(self, host: str, raw: bytes) -> None:
        """Take ``host``'s counts record as stored (one that does not decode reports nothing)."""
        self.remove(host)
        try:
            counts = _DECODER.decode(raw)
        except msgspec.MsgspecError:
            return
        if counts.utilisation is None or not counts.gpus or counts.host != host:
            return
        value = (counts.utilisation, len(counts.gpus))
        self._hosts[host] = value
        self._weighted += value[0] * value[1]
        self._gpus += value[1]

    def remove(self, host: str) -> None:
        """``host`` reports nothing any more (its agent's lease ended)."""
        old = self._hosts.pop(host, None)
        if old is not None:
            self._weighted -= old[0] * old[1]
            self._gpus -= old[1]

    def mean(self) -> float | None:
        """The mean utilisation (%) over the reporting hosts' GPUs; ``None`` when none reports."""
        return round(self._weighted / self._gpus, 1) if self._gpus else None
