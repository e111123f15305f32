"""What every benchmark shares: timing whole processes, medians and spreads, result rows.

A row compares ``ours`` with a ``baseline`` measured in the same run (these
machines are shared and noisy, so only ratios are judged), or holds a count
or a size judged on its own. Samples of ours and of the baseline are taken
interleaved, so noise hits both alike; a row reports their medians and the
spread (10th to 90th percentile) of each.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

__all__ = [
    "REPO",
    "Row",
    "allocator_cli",
    "clean_env",
    "interleaved",
    "percentile",
    "ratio_row",
    "spread",
    "timed_run",
    "value_row",
]


@dataclass
class Row:
    """One line of the results table (and one object of ``results.json``)."""

    name: str
    ours: float
    baseline: float | None
    ratio: float | None
    target: str
    passed: bool
    unit: str
    spread: dict[str, list[float]] = field(default_factory=dict)
    samples: int = 0
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        """The row as ``results.json`` holds it."""
        return {
            "name": self.name,
            "ours": round(self.ours, 4),
            "baseline": None if self.baseline is None else round(self.baseline, 4),
            "ratio": None if self.ratio is None else round(self.ratio, 3),
            "target": self.target,
            "pass": self.passed,
            "unit": self.unit,
            "spread": {k: [round(v, 4) for v in pair] for k, pair in self.spread.items()},
            "samples": self.samples,
            "note": self.note,
        }


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``samples``, nearest rank."""
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def spread(samples: Sequence[float], scale: float = 1.0) -> list[float]:
    """The 10th and 90th percentiles of ``samples`` (times ``scale``)."""
    return [percentile(samples, 10) * scale, percentile(samples, 90) * scale]


def ratio_row(
    name: str,
    ours: Sequence[float],
    baseline: Sequence[float],
    *,
    most: float | None = None,
    least: float | None = None,
    unit: str = "ms",
    scale: float = 1000.0,
    stat: Callable[[Sequence[float]], float] = statistics.median,
    note: str = "",
) -> Row:
    """A row judged by ``stat(ours) / stat(baseline)``: at ``most``, or at ``least``."""
    mine, theirs = stat(ours) * scale, stat(baseline) * scale
    ratio = mine / theirs if theirs else float("inf")
    if most is not None:
        target, passed = f"<= {most:g}x", ratio <= most
    else:
        assert least is not None
        target, passed = f">= {least:g}x", ratio >= least
    return Row(
        name,
        mine,
        theirs,
        ratio,
        target,
        passed,
        unit,
        {"ours": spread(ours, scale), "baseline": spread(baseline, scale)},
        min(len(ours), len(baseline)),
        note,
    )


def value_row(
    name: str, value: float, most: float, unit: str, *, samples: int = 1, note: str = ""
) -> Row:
    """A row judged on its own: ``value`` at most ``most``."""
    return Row(
        name, value, None, None, f"<= {most:g} {unit}", value <= most, unit, {}, samples, note
    )


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without allocator, etcdctl or byte-code settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ALLOCATOR_", "ETCDCTL_", "CONSUL_"))
        and k != "PYTHONDONTWRITEBYTECODE"
    }
    env.update(extra)
    return env


def allocator_cli(*args: str) -> list[str]:
    """The installed CLI, run the way an operator runs it."""
    return [str(Path(sys.executable).parent / "allocator"), *args]


def timed_run(argv: Sequence[str], env: dict[str, str], ok: Sequence[int] = (0,)) -> float:
    """Seconds one process takes from spawn to exit; its exit code must be in ``ok``."""
    started = time.perf_counter()
    result = subprocess.run(list(argv), env=env, capture_output=True, check=False)
    elapsed = time.perf_counter() - started
    if result.returncode not in ok:
        shown = " ".join(argv)[:200]
        raise SystemExit(f"{shown} exited {result.returncode}: {result.stderr.decode()[-500:]}")
    return elapsed


def interleaved(
    runs: dict[str, Callable[[], float]], rounds: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Call every measurement once per round, in turn; the samples of each."""
    for _ in range(warmup):
        for run in runs.values():
            run()
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            samples[name].append(run())
    return samples


def byte_compile() -> None:
    """Compile the package as an installed copy is (a checkout may forbid ``.pyc`` files)."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(REPO / "allocator")],
        check=True,
        env=clean_env(),
    )


def command_server_ready(env: dict[str, str]) -> int | None:
    """Start the user's command server with one command, and wait until it serves; its pid.

    A server loads the CLI's modules once (a second or two): rows that time the
    console script measure what an operator's second command costs, not the first.
    ``None``, said on stderr, when none starts (an installed script older than the
    server, ``ALLOCATOR_SERVER=0``): the rows then time commands in their own process.
    """
    from allocator.resident import wire

    path = wire.socket_path(env, str(REPO / "allocator")) if wire.enabled(env) else None
    if path is not None:
        subprocess.run(allocator_cli("get", "job=-"), env=env, capture_output=True, check=False)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                if Path(path).exists():
                    return int(Path(f"{path}.lock").read_text())
            time.sleep(0.05)
    print("   (no command server started: these rows time commands in their own process)",
          file=sys.stderr)  # fmt: skip
    return None


def stop_command_servers(runtime: Path) -> None:
    """Stop every command server whose socket is under ``runtime`` (a bench run's own)."""
    import signal

    for lock in runtime.glob("allocator-*/server-*.lock"):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(lock.read_text()), signal.SIGTERM)
