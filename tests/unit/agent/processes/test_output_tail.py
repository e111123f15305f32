"""A failed worker's last lines, as its record keeps them: the last run's, bounded, safe."""

from __future__ import annotations

import os
from pathlib import Path

from allocator.agent.processes.output_tail import MAX_BYTES, last_lines, read_end
from allocator.records.types import WorkerRecord

HEADER = b"--- allocator 2026-06-01T12:00:00Z: starting job train worker 0 (new) ---\n"


def test_only_the_last_run_counts_and_blank_lines_do_not() -> None:
    raw = HEADER + b"old run failed\n" + HEADER + b"one\n\n  \ntwo\r\n"
    assert last_lines(raw) == ("one", "two")


def test_the_tail_is_bounded_in_lines_and_bytes() -> None:
    many = b"".join(f"line {i}\n".encode() for i in range(50))
    assert last_lines(HEADER + many) == tuple(f"line {i}" for i in range(40, 50))
    wide = b"".join(b"x" * 500 + f" {i}\n".encode() for i in range(10))
    kept = last_lines(wide)
    assert sum(len(line.encode()) for line in kept) <= MAX_BYTES and kept[-1].endswith(" 9")
    long = last_lines(b"y" * 10000 + b" the error at the end\n")
    assert len(long) == 1 and long[0].endswith("the error at the end")
    assert len(long[0].encode()) <= MAX_BYTES


def test_control_characters_are_escaped_and_secrets_masked() -> None:
    raw = b"\x1b[2Jcleared\nkey=hunter2-very-secret\n\xff bad utf-8\n"
    assert last_lines(raw, ["hunter2-very-secret"]) == (
        "\\x1b[2Jcleared",
        "key=***",
        "\ufffd bad utf-8",
    )


def test_a_symlink_or_a_missing_log_reads_as_nothing(tmp_path: Path) -> None:
    target = tmp_path / "secret"
    target.write_text("not the job's\n")
    os.symlink(target, tmp_path / "job.log")
    assert read_end(tmp_path / "job.log") == b""
    assert read_end(tmp_path / "missing.log") == b""
    big = tmp_path / "big.log"
    big.write_bytes(b"a" * 100 + b"\nlast\n")
    assert read_end(big, size=20) == b"last\n"  # the cut first line is dropped


def test_a_record_written_before_the_fields_reads_without_them() -> None:
    old = b'{"job":"train","host":"node1","state":"gave-up","schema_version":1}'
    record = WorkerRecord.from_json(old)
    assert record.output_tail == () and record.log_path is None
