"""``allocator serve``: history requests have threads of their own; ``/metrics`` never waits.

History is read from the store on request; status, the page and
``/metrics`` are answered from the mirror. A burst of history requests
that the store is slow to answer (here: etcd frozen with SIGSTOP, so each
waits out its call's deadline) must not hold up a Prometheus scrape.
"""

from __future__ import annotations

import threading
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from tests.e2e.serve_harness import Served
from tests.support.waiting import wait_for

#: More than every thread a Python process would share among them (min(32, cores + 4)).
BURST = 36


def test_a_burst_of_history_requests_does_not_hold_up_metrics(
    prefix: str, tmp_path: Path, etcd_server_private: Any
) -> None:
    url = f"{etcd_server_private.url}?timeout=4"
    # Every request comes from this one address: let it hold more than the burst.
    served = Served(url, prefix, tmp_path, "--max-client-connections", str(2 * BURST))
    finished: list[int] = []
    lock = threading.Lock()

    def history() -> None:
        try:
            with urllib.request.urlopen(served.base + "/api/v1/history?limit=1", timeout=120):
                pass
        except OSError:  # the 503 of a store that did not answer
            pass
        with lock:
            finished.append(1)

    def to_etcd() -> int:
        connections = psutil.Process(served.process.pid).net_connections(kind="tcp")
        port = etcd_server_private.client_port
        return sum(1 for c in connections if c.raddr and c.raddr.port == port)

    try:
        assert served.get("/metrics")[0] == 200
        before = to_etcd()  # the watcher's
        etcd_server_private.pause()
        threads = [threading.Thread(target=history, daemon=True) for _ in range(BURST)]
        for thread in threads:
            thread.start()
        # Every history thread serve has is now waiting for the frozen store.
        wait_for("history requests to wait for etcd", lambda: to_etcd() >= before + 4)
        code, body, _ = served.get("/metrics")
        with lock:
            done = len(finished)
        assert code == 200 and b"allocator_fleet_gpus" in body
        # Answered while the history requests still wait for the store (a 4 s deadline each).
        assert done == 0
        etcd_server_private.resume()
        wait_for("the history requests to end", lambda: len(finished) == BURST, timeout=120)
    finally:
        etcd_server_private.resume()
        served.close()
