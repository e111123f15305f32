"""`allocator history` in-process: selecting entries, the table, and refusing bad words."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from allocator.cli import main

EXAMPLE = Path(__file__).resolve().parents[3] / "config" / "policy.example.yaml"


@pytest.fixture
def store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    url = f"sqlite://{tmp_path / 'store.db'}"
    for words in (
        ["policy", "apply", str(EXAMPLE)],
        ["set", "job=train", "gpus=1", "host=node1"],
        ["set", "job=big", "gpus=1", "host=node2"],
        ["set", "job=train", "gpus=2", "host=node1", "reason=move it"],
    ):
        assert main([*words, "--store", url]) == 0
    capsys.readouterr()
    return url


def _entries(capsys: pytest.CaptureFixture[str], store: str, *words: str) -> list[Any]:
    assert main(["history", *words, "--store", store, "-o", "json"]) == 0
    entries: list[dict[str, Any]] = json.loads(capsys.readouterr().out)["entries"]
    return [(e["action"], e["host"], e["job"]) for e in entries]


def test_history_selects_one_hosts_entries_and_the_policy_applies(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _entries(capsys, store, "host=node2") == [
        ("set", "node2", "big"),
        ("policy-apply", None, None),
    ]


def test_history_selects_entries_touching_a_gpu_without_policy_applies(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _entries(capsys, store, "gpu=1") == [
        ("move", "node1", "train"),
        ("set", "node2", "big"),
        ("set", "node1", "train"),
    ]
    assert _entries(capsys, store, "gpu=1", "host=node1", "job=train") == [
        ("move", "node1", "train"),
        ("set", "node1", "train"),
    ]


def test_history_since_and_limit_cut_older_entries(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert len(_entries(capsys, store, "--since", "1h")) == 4
    assert _entries(capsys, store, "--since", "2999-01-01T00:00:00Z") == []
    assert _entries(capsys, store, "--limit", "1") == [("move", "node1", "train")]


def test_history_table_shows_from_and_to_and_the_reason(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["history", "job=train", "--store", store]) == 0
    header, move, first = capsys.readouterr().out.splitlines()
    assert header.split() == ["WHEN", "HOST", "JOB", "ACTION", "FROM", "TO", "BY", "REASON"]
    assert move.split()[1:6] == ["node1", "train", "move", "1", "2"]
    assert move.endswith("move it")
    assert first.split()[3:6] == ["set", "-", "1"]


def test_history_with_nothing_to_show_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite://{tmp_path / 'store.db'}"
    assert main(["policy", "apply", str(EXAMPLE), "--store", url]) == 0
    capsys.readouterr()
    assert main(["history", "job=nobody", "--store", url]) == 0
    assert capsys.readouterr().out == "no history matches\n"


@pytest.mark.parametrize(
    ("words", "fragment"),
    [
        (["gpu=x"], "not a GPU index"),
        (["gpu=1,2"], "give one GPU index"),
        (["job=../x"], "may contain only"),
        (["hots=node1"], "did you mean 'host'"),
        (["--since", "yesterday"], "expected a duration"),
        (["--limit", "0"], "--limit 0"),
        (["--limit", "9" * 30], "expected a whole number"),
    ],
)
def test_bad_history_words_are_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], words: list[str], fragment: str
) -> None:
    missing = f"sqlite://{tmp_path / 'never-opened.db'}"
    assert main(["history", *words, "--store", missing]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err
    assert list(tmp_path.iterdir()) == []
