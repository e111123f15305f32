"""``history:``: sized against the store's quota, with a default that fits the fleet."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocator.cli import main
from allocator.errors import PolicyError
from allocator.policy import load_policy
from allocator.policy.history_field import default_entries, history_bytes
from allocator.policy.model import DEFAULT_HISTORY_BYTES

FLEET = "version: 1\nhosts:\n  node[00000-12499]: {gpus: 8}\n"
LAB = "version: 1\nhosts:\n  node[1-10]: {gpus: 8}\n"


def errors_of(text: str) -> list[tuple[int | None, str | None, str]]:
    with pytest.raises(PolicyError) as info:
        load_policy(text, "p.yaml")
    return [(e.line, e.field, e.reason) for e in info.value.errors]


def test_the_arithmetic_entries_times_streams_times_entry_bytes() -> None:
    assert history_bytes(1000, 12_501) == 1000 * 12_501 * (480 + 160)  # ~7.5 GiB
    assert default_entries(12_501, DEFAULT_HISTORY_BYTES) == 67  # 512 MiB / (12,501 x 640 B)
    assert default_entries(11, DEFAULT_HISTORY_BYTES) == 1000  # capped at the usual 1,000
    assert default_entries(800_000, DEFAULT_HISTORY_BYTES) == 1


def test_left_out_entries_per_host_is_the_most_the_fleet_fits() -> None:
    assert load_policy(FLEET).history.entries_per_host == 67
    assert load_policy(LAB).history.entries_per_host == 1000
    bigger = load_policy(FLEET + "history: {max_bytes: 1GiB}\n").history
    assert (bigger.entries_per_host, bigger.max_bytes) == (134, 1024**3)


def test_an_oversized_history_is_refused_with_the_numbers_and_the_fix() -> None:
    ((line, field, reason),) = errors_of(FLEET + "history: {entries_per_host: 1000}\n")
    assert (line, field) == (4, "history.entries_per_host")
    assert reason == (
        "1,000 entries x 12,501 streams (12,500 hosts and the policy) x ~640 B = 7.5 GiB, "
        "more than history.max_bytes (512 MiB; etcd refuses every write past its quota, "
        "2 GiB by default): set history.entries_per_host: 67 (or leave it out for that "
        "default), and history.max_age to drop old entries sooner"
    )
    assert load_policy(FLEET + "history: {entries_per_host: 67}\n").history.entries_per_host == 67


def test_a_cap_too_small_for_one_entry_a_stream_is_refused() -> None:
    text = "version: 1\nhosts:\n  node[00000-19999]: {gpus: 1}\nhistory: {max_bytes: 1MiB}\n"
    ((_, field, reason),) = errors_of(text)
    assert field == "history.entries_per_host"
    assert "1 MiB cannot hold one entry" in reason and "20,001 streams" in reason


@pytest.mark.parametrize(
    ("written", "size"),
    [("512MiB", 512 * 1024**2), ("1GiB", 1024**3), ("800MB", 800 * 1000**2), (2**30, 2**30)],
)
def test_max_bytes_takes_a_size_with_a_unit(written: object, size: int) -> None:
    assert load_policy(LAB + f"history: {{max_bytes: {written}}}\n").history.max_bytes == size


@pytest.mark.parametrize(
    ("written", "fragment"),
    [("lots", "expected a size like 512MiB"), ("16GiB", "must be from 1 MiB to 8 GiB")],
)
def test_max_bytes_refuses_what_is_not_a_size_in_range(written: str, fragment: str) -> None:
    ((_, field, reason),) = errors_of(LAB + f"history: {{max_bytes: {written}}}\n")
    assert field == "history.max_bytes" and fragment in reason


def test_max_age_is_a_duration_of_an_hour_or_more() -> None:
    assert load_policy(LAB + "history: {max_age: 30d}\n").history.max_age_seconds == 30 * 86_400
    ((_, field, reason),) = errors_of(LAB + "history: {max_age: 5m}\n")
    assert field == "history.max_age" and "at least 1h" in reason


def test_validate_refuses_an_oversized_history_with_exit_2_and_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET + "history: {entries_per_host: 1000}\n")
    assert main(["policy", "validate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "history.entries_per_host: 1,000 entries x 12,501 streams" in err[0]
    assert "set history.entries_per_host: 67" in err[0]
