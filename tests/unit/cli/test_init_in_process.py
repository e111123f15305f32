"""The CLI in-process: no input makes it crash or print a traceback."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator.cli import main

EXAMPLE = Path(__file__).resolve().parents[3] / "config" / "policy.example.yaml"

_word = st.one_of(
    st.sampled_from(
        [
            "set",
            "get",
            "release",
            "status",
            "policy",
            "show",
            "schema",
            "-o",
            "json",
            "yaml",
            "--help",
        ]
    ),
    st.builds(
        lambda k, v: f"{k}={v}",
        st.sampled_from(["job", "gpus", "count", "host", "reason"]),
        st.one_of(
            st.sampled_from(["train", "node1", "node2", "0", "1,3", "0-3", "cpu", "9", "-1", ""]),
            st.text(max_size=12),
        ),
    ),
    st.text(max_size=12),
)


@pytest.fixture(scope="module")
def store_url() -> str:
    url = f"memory://cli-fuzz-{uuid.uuid4().hex}"
    assert main(["policy", "apply", str(EXAMPLE), "--store", url]) == 0
    return url


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(_word, max_size=6))
def test_any_argv_gives_a_documented_exit_code_and_one_line(
    store_url: str, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    try:
        code = main([*argv, "--store", store_url])
    except SystemExit as exc:  # --help and --version exit through argparse
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    assert code in (0, 2, 3, 6), (argv, code, captured.err)  # 6: a job that holds nothing
    assert "Traceback" not in captured.err
    if code != 0:
        assert len(captured.err.strip().splitlines()) == 1, captured.err


@pytest.mark.parametrize("typed", ["-\x1e", "a\nb", "x\x00y", "\u2028z"])
def test_control_characters_in_input_never_split_the_error_line(
    store_url: str, capsys: pytest.CaptureFixture[str], typed: str
) -> None:
    assert main(["set", f"job={typed}", "gpus=0", "--store", store_url]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.endswith("\n"), repr(err)


def test_a_password_given_with_store_is_warned_of_and_masked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"memory://pw-{tmp_path.name}?token=hunter22"
    assert main(["policy", "apply", str(EXAMPLE), "--store", url]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("allocator: warning: --store carries a password or token")
    assert "ALLOCATOR_STORE" in lines[0] and "hunter22" not in lines[0]


def test_a_refused_command_prints_its_one_line_and_no_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite://{tmp_path}/s.db?password=hunter22"  # refused: SQLite takes no password
    assert main(["status", "--store", url]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("allocator: error: SQLite store URL") and "hunter22" not in line


def test_a_store_url_without_a_secret_gets_no_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "--store", f"sqlite://{tmp_path}/none.db"]) == 4
    assert "warning" not in capsys.readouterr().err
