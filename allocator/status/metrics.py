"""Prometheus exposition for the agent and ``allocator serve``: plain data in, text out.

What to export is computed as plain :class:`Family` values (easy to test, no
library needed); ``prometheus_client`` is imported only by the functions
that serve them, so an agent without ``--metrics-port`` never loads it.
A collector builds every family from the current state at scrape time: a
job that is gone has no series left behind.

Names follow Prometheus conventions: ``allocator_`` prefix, base units
(seconds, bytes, ratios), ``_total`` counters (added by the client library).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "CONTENT_TYPE",
    "Family",
    "Histogram",
    "exposition",
    "start_metrics_server",
]

#: The text format's content type (as ``prometheus_client`` serves it).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Labels = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Family:
    """One metric: its name (without ``_total``), kind, help, label names and samples."""

    name: str
    kind: Literal["gauge", "counter"]
    help: str
    labels: Labels = ()
    samples: Sequence[tuple[Labels, float]] = ()


@dataclass(slots=True)
class Histogram:
    """A cumulative histogram, observed in one thread and read by the scraping one."""

    name: str
    help: str
    bounds: tuple[float, ...]
    _counts: list[int] = field(default_factory=list)
    _total: float = 0.0
    _count: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._counts = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        """Count one observation."""
        with self._lock:
            for n, bound in enumerate(self.bounds):
                if value <= bound:
                    self._counts[n] += 1
            self._total += value
            self._count += 1

    def snapshot(self) -> tuple[list[tuple[str, float]], float]:
        """Cumulative buckets (``le`` text, count; ``+Inf`` last) and the sum, consistently."""
        with self._lock:
            buckets = [(f"{b:g}", float(c)) for b, c in zip(self.bounds, self._counts, strict=True)]
            buckets.append(("+Inf", float(self._count)))
            return buckets, self._total


def _families(source: Callable[[], Sequence[Family | Histogram]]) -> Iterator[Any]:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    for item in source():
        if isinstance(item, Histogram):
            buckets, total = item.snapshot()
            yield HistogramMetricFamily(item.name, item.help, buckets=buckets, sum_value=total)
            continue
        kind = GaugeMetricFamily if item.kind == "gauge" else CounterMetricFamily
        family = kind(item.name, item.help, labels=list(item.labels))
        for values, value in item.samples:
            family.add_metric(list(values), value)
        yield family


def _registry(source: Callable[[], Sequence[Family | Histogram]]) -> Any:
    from prometheus_client import CollectorRegistry

    class _Collector:
        def collect(self) -> Iterator[Any]:
            return _families(source)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    return registry


def exposition(source: Callable[[], Sequence[Family | Histogram]]) -> bytes:
    """The Prometheus text format of what ``source`` returns now."""
    from prometheus_client import generate_latest

    data: bytes = generate_latest(_registry(source))
    return data


def start_metrics_server(
    source: Callable[[], Sequence[Family | Histogram]], address: str, port: int
) -> Callable[[], None]:
    """Serve ``/metrics`` on ``address:port`` in a daemon thread; return a function that stops it.

    ``OSError`` if the port cannot be bound (in use, no permission).
    """
    from prometheus_client import start_http_server

    server, thread = start_http_server(port, addr=address, registry=_registry(source))

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(5)

    return stop
