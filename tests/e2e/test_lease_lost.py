"""``allocator.lease()`` that loses its hold says so in the holder's thread, at once.

An operator's ``release`` (or a store down longer than the TTL) takes the
GPUs back: the ``with`` block must not go on as if it still had them.
"""

from __future__ import annotations

import subprocess
import sys

from tests.e2e.conftest import Cli
from tests.support.waiting import wait_for

LOOP = """
import sys, time
import allocator
from allocator.errors import LeaseLost
lost = []
kwargs = {"on_lost": lost.append} if sys.argv[1] == "callback" else {}
try:
    with allocator.lease(count=1, host="node1", job="notebook", ttl=1, **kwargs):
        print("held", flush=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not lost:  # a training loop
            time.sleep(0.02)
        print("callback" if lost else "went on", flush=True)
except LeaseLost as exc:
    print("raised:", exc, flush=True)
"""


def _lose(applied: Cli, cli_env: dict[str, str], how: str) -> str:
    proc = subprocess.Popen([sys.executable, "-c", LOOP, how], env=cli_env,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "held\n"
        wait_for("the hold", lambda: applied("get", "job=notebook").code == 0)
        assert applied("release", "job=notebook", "reason=needed").code == 0
        out, _ = proc.communicate(timeout=15)
        return out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_lost_lease_raises_in_the_holders_thread(applied: Cli, cli_env: dict[str, str]) -> None:
    out = _lose(applied, cli_env, "raise")
    assert out.startswith("raised:") and "released or changed by someone else" in out, out


def test_a_lost_lease_calls_the_callback_instead(applied: Cli, cli_env: dict[str, str]) -> None:
    assert _lose(applied, cli_env, "callback") == "callback\n"
