"""Contract: no policy file or CLI word list gets past the documented exits.

Hypothesis writes policy files the way a careless operator or an attacker
would (numbers YAML 1.1 reads differently, sizes no host has, aliases that
multiply, signals that suspend, windows already over) and word lists for
every command, and runs them through the real CLI against a real SQLite
store. Whatever it writes:

* the exit code is one of 0, 2, 3, 4, 5, 6, never 1;
* a non-zero exit prints exactly one line on stderr, never "internal error";
* a refused command leaves the store as it was, byte for byte;
* on a policy ``validate`` accepts, no command is slow: the slowest is
  recorded as a figure and held under a bound computed in the same run from
  the time this machine takes to start a bare Python.
"""

from __future__ import annotations

import contextlib
import io
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from allocator.cli import main
from allocator.store import open_store
from tests.reliability.conftest import Figures, scale

EXITS = {0, 2, 3, 4, 5, 6}
HUGE = "9" * 5000
#: A command may take this many times a bare ``python -c pass`` on this machine
#: (about 1.5 s where that takes 15 ms): the "no command slower than a second"
#: of the issue, scaled to the machine and its load.
SLOW_FACTOR = 100


@dataclass
class Run:
    """One command run in-process."""

    argv: list[str]
    code: int
    out: str
    err: str
    seconds: float


@dataclass
class Worst:
    """The slowest command seen on a policy validate accepted."""

    seconds: float = 0.0
    argv: tuple[str, ...] = ()


def cli(argv: list[str]) -> Run:
    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return Run(argv, code, out.getvalue(), err.getvalue(), time.perf_counter() - started)


def snapshot(url: str, prefix: str) -> tuple[tuple[str, bytes, int, int], ...]:
    """Every key under ``prefix``, with its value and revisions: what a refusal must not touch.

    A SQLite store that does not exist yet (nothing was ever applied) is its own
    snapshot: a refusal must not create it either.
    """
    if url.startswith("sqlite://") and not Path(url.removeprefix("sqlite://")).exists():
        return (("<no store>", b"", 0, 0),)
    store = open_store(url)
    try:
        listing = store.list(prefix + "/")
        return tuple(
            (kv.key, kv.value, kv.create_revision, kv.mod_revision) for kv in listing.items
        )
    finally:
        store.close()


def check(run: Run) -> None:
    assert run.code in EXITS, (run.argv, run.code, run.err)
    assert "internal error" not in run.err and "Traceback" not in run.err, run.err
    if run.code != 0:
        lines = run.err.splitlines()
        assert len(lines) == 1 and run.err.endswith("\n"), (run.argv, run.err)


# --- generated policies -----------------------------------------------------------

HOSTS = (["node1", "node2", "gpu-07"], ["n1.lab", "NODE1"])
JOBS = (["train", "eval-a"], ["Train", "w"])
NUMBERS = (
    ["1", "2", "4", "8"],
    ["0", "1024", "1025", "1000000000000", HUGE, "010", "0x10", "1_0", "1:30", "0b11", "+4",
     "-1", "yes", "on", "'4'", "4.0", ".inf", "1e308", "~"],
)  # fmt: skip
SECONDS = (
    ["2.5", "30", "0", "3600"],
    ["3601", "1e308", "1e-300", ".nan", "-1", "1:30", "'5'", "0.05", "yes"],
)
SIGNALS = (
    ["restart", "none", "signal:SIGHUP", "signal:SIGUSR1"],
    ["signal:SIGTSTP", "signal:SIGCHLD", "signal:SIGRTMIN", "signal:SIGKILL", "signal:HUP", "yes"],
)
BOOLS = (["true", "false"], ["on", "yes", "True", "1", "'true'"])
GLOBS = (["eval-*", "train", "t[ra]ain"], ["*", "?*", "[abc", "-x*", "..", "evl-*"])
TIMES = (
    ["2099-01-01T00:00:00Z", "2099-01-01T00:00:00+02:00", "2000-01-01T00:00:00Z"],
    ["2020-01-01T00:00:00Z", "2099-01-01 00:00:00", "2099-01-01", "'2099-W01-1T00:00:00Z'",
     "2099-13-01T00:00:00Z"],
)  # fmt: skip
GPU_INDEX = (["0", "1"], ["3", "1023", "1024", "010", HUGE, "-1"])
Choices = tuple[list[str], list[str]]


@st.composite
def policies(draw: st.DrawFn) -> tuple[str, str, str]:
    """A policy file's text, a job and a host of it: half clean, half with mistakes and attacks."""
    hostile = draw(st.booleans())

    def pick(choices: Choices) -> str:
        good, bad = choices
        if hostile and draw(st.integers(0, 3)) == 0:
            return draw(st.sampled_from(bad))
        return draw(st.sampled_from(good))

    lines = ["version: 1", "hosts:"]
    hosts = list(dict.fromkeys(pick(HOSTS) for _ in range(draw(st.integers(1, 3)))))
    lines += [f"  {host}: {{gpus: {pick(NUMBERS)}}}" for host in hosts]
    jobs = list(dict.fromkeys(pick(JOBS) for _ in range(draw(st.integers(1, 3)))))
    # An anchored command shared by aliases: a few, or enough to multiply the file.
    width = draw(st.sampled_from([0, 0, 3, 200, 2000]))
    copies = draw(st.sampled_from([0, 5, 400])) if width else 0
    lines.append("jobs:")
    for index, job in enumerate(jobs):
        if width and index == 0:
            command = "&cmd [" + ", ".join(["x"] * width) + "]"
        else:
            command = "*cmd" if width and draw(st.booleans()) else "[python, -m, w]"
        fields = [f"command: {command}", "fallback: cpu"]
        for key, choices in (
            ("grace_seconds", SECONDS),
            ("on_change", SIGNALS),
            ("allow_adhoc_command", BOOLS),
            ("max_restarts", NUMBERS),
        ):
            if draw(st.integers(0, 2)) == 0:
                fields.append(f"{key}: {pick(choices)}")
        lines.append(f"  {job}: {{{', '.join(fields)}}}")
    lines += [f"  copy{index}: {{command: *cmd}}" for index in range(copies)]
    lines += ["fallback:", f"  cpu: {{action: cpu, threads: {pick(NUMBERS)}}}"]
    if draw(st.booleans()):
        window = draw(st.sampled_from(["", "start", "until"]))
        when = f", {window}: {pick(TIMES)}" if window else ""
        lines += [
            "reservations:",
            f"  - {{name: r, host: {hosts[0]}, gpus: [{pick(GPU_INDEX)}], "
            f"for: [{pick(GLOBS)}]{when}}}",
        ]
    if draw(st.integers(0, 3)) == 0:
        lines.append(f"health: {{interval_seconds: {pick(SECONDS)}}}")
    return "\n".join(lines) + "\n", jobs[0], hosts[0]


# --- generated words ----------------------------------------------------------------

VALUES = {
    "job": st.sampled_from(
        [*JOBS[0], *JOBS[1], "copy0", "ghost", "", "a/b", "x" * 64, "a\nb", "x" * 2000]
    ),
    "host": st.sampled_from([*HOSTS[0], *HOSTS[1], "nowhere", "", "..", "-x", "h" * 300]),
    "gpus": st.sampled_from(
        ["0", "1,3", "0-3", "3,0", "cpu", "0,0", "3-1", "1023", "1024", HUGE, f"0-{HUGE}", "a"]
    ),
    "count": st.sampled_from(["1", "2", "4", "1024", "1025", "0", "-1", HUGE, "x", ""]),
    "worker": st.sampled_from(["0", HUGE, "x", "-1"]),
    "reason": st.sampled_from(["", "maintenance", "a\x1bb", "r" * 201, "r" * 5000]),
}
WORD = st.one_of(
    *(st.builds(lambda k, v: f"{k}={v}", st.just(key), values) for key, values in VALUES.items()),
    st.sampled_from(["nonsense", "=x", "k" * 5000 + "=1", "job", "gpus=="]),
)
VERBS = st.sampled_from(["set", "get", "release", "env", "status"])
COMMANDS = st.one_of(
    st.tuples(VERBS, st.lists(WORD, max_size=4)),
    st.just(("status", ["-o", "json"])),
    st.just(("policy", ["show"])),
)  # fmt: skip


# The issue's reproductions, run on every run whatever else is drawn.
CLEAN = ("version: 1\nhosts: {node1: {gpus: 4}}\njobs: {train: {command: [x]}}\n", "train", "node1")
ISSUE_HUGE_HOST = (
    "version: 1\nhosts: {node1: {gpus: 1000000000000}, node2: {gpus: 2}}\n"
    "jobs: {train: {command: [x]}}\n",
    "train",
    "node2",
)
ISSUE_ALIASES = (
    "version: 1\njobs:\n  train: {command: &cmd ["
    + ", ".join(["x"] * 2000)
    + "]}\n"
    + "".join(f"  copy{i}: {{command: *cmd}}\n" for i in range(400))
    + "hosts: {node1: {gpus: 4}}\n",
    "train",
    "node1",
)


@pytest.fixture(scope="module")
def store_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="policy-input-") as directory:
        yield Path(directory)


@pytest.fixture(scope="module")
def slow_bound() -> float:
    """Seconds no command may take: SLOW_FACTOR times a bare Python start, measured now."""
    times = []
    for _ in range(5):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append(time.perf_counter() - started)
    return SLOW_FACTOR * statistics.median(times)


def test_no_policy_or_word_list_gets_past_the_documented_exits(
    store_dir: Path, slow_bound: float, figures: Figures
) -> None:
    url = f"sqlite://{store_dir / 'store.db'}"
    worst = Worst()
    counts = {"policies": 0, "accepted": 0, "commands": 0}

    @settings(
        max_examples=scale(25, 400),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(policy=policies(), commands=st.lists(COMMANDS, max_size=6))
    @example(policy=ISSUE_HUGE_HOST, commands=[])
    @example(policy=ISSUE_ALIASES, commands=[])
    @example(policy=CLEAN, commands=[("set", ["job=train", f"count={HUGE}"])])
    @example(policy=CLEAN, commands=[("env", ["job=train", f"worker={HUGE}"])])
    def exercise(policy: tuple[str, str, str], commands: list[tuple[str, list[str]]]) -> None:
        text, job, host = policy
        # every policy gets the whole-fleet read and a placement, whatever else is drawn
        commands = [("status", []), ("set", [f"job={job}", "count=1", f"host={host}"]), *commands]
        prefix = f"/c-{uuid.uuid4().hex[:12]}"
        path = store_dir / f"{prefix[1:]}.yaml"
        path.write_text(text)
        common = ["--store", url, "--prefix", prefix]
        counts["policies"] += 1
        validated = cli(["policy", "validate", str(path)])
        check(validated)
        assert validated.code in (0, 2)
        before = snapshot(url, prefix)
        applied = cli(["policy", "apply", str(path), *common])
        check(applied)
        if validated.code != 0:
            assert applied.code == 2 and applied.err == validated.err
        runs = [validated, applied]
        if applied.code != 0:
            assert snapshot(url, prefix) == before
        for command, words in commands if applied.code == 0 else []:
            before = snapshot(url, prefix)
            run = cli([command, *words, *common])
            check(run)
            if run.code != 0:
                assert snapshot(url, prefix) == before, run
            runs.append(run)
        counts["commands"] += len(runs)
        if validated.code == 0:
            counts["accepted"] += 1
            slowest = max(runs, key=lambda r: r.seconds)
            if slowest.seconds > worst.seconds:
                worst.seconds, worst.argv = slowest.seconds, tuple(slowest.argv[:3])
        path.unlink()

    exercise()
    figures.add("policies generated", counts["policies"])
    figures.add("policies validate accepted", counts["accepted"])
    figures.add("commands run", counts["commands"])
    figures.add("slowest command on an accepted policy (s)", round(worst.seconds, 3))
    figures.add("bound (s)", round(slow_bound, 3))
    assert counts["accepted"] > 0
    assert worst.seconds < slow_bound, (worst, slow_bound)
