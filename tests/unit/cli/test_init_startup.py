"""What a command loads at start-up: only its own parser, and no more of the standard library."""

from __future__ import annotations

import socket

import pytest

from allocator.cli import COMMANDS, build_parser, command_word, main
from allocator.util.identity import local_hostname


@pytest.mark.parametrize(
    ("words", "command"),
    [
        (["set", "job=a"], "set"),
        (["--store", "sqlite:///x.db", "set", "job=a"], "set"),
        (["--prefix", "/p", "-o", "json", "get", "job=a"], "get"),
        (["--output=json", "status"], "status"),
        (["-ojson", "policy", "show"], "policy"),
        (["--help"], None),
        (["--version", "set"], None),
        (["-h", "set"], None),
        ([], None),
        (["--store"], None),
    ],
)
def test_the_command_word_is_found_after_global_options(
    words: list[str], command: str | None
) -> None:
    assert command_word(words) == command


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_module_registers_the_command_it_is_listed_under(name: str) -> None:
    parser = build_parser(only=name)
    args = parser.parse_args([name, *_minimal_args(name)])
    assert args.command == name


def _minimal_args(name: str) -> list[str]:
    """Words the command's own parser accepts (some commands require a sub-command)."""
    return {"policy": ["show"], "completion": ["bash"]}.get(name, [])


def test_the_full_parser_lists_every_command_in_order() -> None:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    assert list(subparsers.choices) == list(COMMANDS)  # type: ignore[arg-type]


def test_a_mistyped_command_still_names_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sett", "job=a"]) == 2
    error = capsys.readouterr().err
    assert "invalid choice: 'sett'" in error
    assert all(f"'{name}'" in error for name in COMMANDS)


def test_help_wraps_at_the_width_columns_says(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "50")
    with pytest.raises(SystemExit):
        main(["set", "--help"])
    lines = capsys.readouterr().out.splitlines()
    body = lines[lines.index("") + 1 :]  # the usage line is the command's own, unwrapped
    assert body and max(len(line) for line in body) <= 50
    assert any(len(line) > 40 for line in body)  # wrapped near the width, not far short of it


def test_the_local_host_name_is_the_one_the_system_reports() -> None:
    assert local_hostname() == socket.gethostname().split(".")[0]
