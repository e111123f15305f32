"""The key=value grammar: every accepted form, every refusal, and no crash on any input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from allocator.cli.args import (
    SetArgs,
    parse_gpu_list,
    parse_key_values,
    parse_set_args,
    parse_target_args,
)
from allocator.errors import InvalidInput


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["job=train", "gpus=1,3"], SetArgs(job="train", host=None, gpus=(1, 3))),
        (["gpus=3,1", "job=train"], SetArgs(job="train", host=None, gpus=(3, 1))),
        (["job=t", "gpus=0-3"], SetArgs(job="t", host=None, gpus=(0, 1, 2, 3))),
        (["job=t", "gpus=0-1,5"], SetArgs(job="t", host=None, gpus=(0, 1, 5))),
        (["job=t", "gpus=cpu"], SetArgs(job="t", host=None, cpu=True)),
        (["job=t", "count=2", "host=node7"], SetArgs(job="t", host="node7", count=2)),
        (
            ["job=t", "gpus=2", "reason=debug run"],
            SetArgs(job="t", host=None, gpus=(2,), reason="debug run"),
        ),
        (["job=t", "gpus=2", "slots=3"], SetArgs(job="t", host=None, gpus=(2,), slots=3)),
        (
            ["job=t", "count=2", "slots=1", "prefer=links"],
            SetArgs(job="t", host=None, count=2, slots=1, prefer="links"),
        ),
    ],
)
def test_set_accepts(words: list[str], expected: SetArgs) -> None:
    assert parse_set_args(words) == expected


@pytest.mark.parametrize(
    ("words", "message"),
    [
        ([], "job= is required"),
        (["gpus=1"], "job= is required"),
        (["job=t"], "exactly one of"),
        (["job=t", "gpus=1", "count=2"], "exactly one of"),
        (["job=t", "gpu=1"], "did you mean 'gpus'"),
        (["job=t", "train"], "expected key=value"),
        (["job=t", "job=u", "gpus=1"], "given twice"),
        (["job=t", "gpus="], "gpus= is empty"),
        (["job=t", "gpus=1,1"], "listed twice"),
        (["job=t", "gpus=0-2,1"], "listed twice"),
        (["job=t", "gpus=3-1"], "runs backwards"),
        (["job=t", "gpus=-1"], "not a GPU index"),
        (["job=t", "gpus=1, 3"], "not a GPU index"),
        (["job=t", "gpus=a"], "not a GPU index"),
        (["job=t", "gpus=\u0661"], "not a GPU index"),  # an Arabic-Indic digit one
        (["job=t", "gpus=99999"], "out of range"),
        (["job=t", "count=0"], "between 1"),
        (["job=t", "count=two"], "positive whole number"),
        (["job=../x", "gpus=1"], "may contain only"),
        (["job=a/b", "gpus=1"], "may contain only"),
        (["job=", "gpus=1"], "must not be empty"),
        (["job=" + "x" * 300, "gpus=1"], "at most 63"),
        (["job=trainé", "gpus=1"], "may contain only"),
        (["job=t", "gpus=1", "host=.."], "not allowed"),
        (["job=t", "gpus=1", "reason=a\nb"], "control characters"),
        (["job=t", "gpus=1", "reason=" + "r" * 201], "at most 200"),
        (["job=t", "gpus=1", "slots=0"], "from 1 to 256"),
        (["job=t", "gpus=1", "slots=257"], "from 1 to 256"),
        (["job=t", "gpus=1", "slots=two"], "from 1 to 256"),
        (["job=t", "gpus=cpu", "slots=2"], "gpus=cpu holds none"),
        (["job=t", "count=1", "prefer=nvlink"], "expected free or links"),
        (["job=t", "gpus=1", "prefer=links"], "gpus= names them already"),
    ],
)
def test_set_refuses_with_one_clear_line(words: list[str], message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_set_args(words)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_gpu_list_keeps_the_order_given() -> None:
    # Visible devices are renumbered in listed order, so the order is meaningful.
    assert parse_gpu_list("2,0,1") == (2, 0, 1)


def test_target_args() -> None:
    assert parse_target_args(["job=t", "host=n1"]) == ("t", "n1")
    assert parse_target_args(["job=t"]) == ("t", None)
    with pytest.raises(InvalidInput, match="job= is required"):
        parse_target_args(["host=n1"])


def test_key_values_unknown_key_lists_known_keys() -> None:
    with pytest.raises(InvalidInput, match=r"keys: host"):
        parse_key_values(["zzz=1"], ("host",))


_words = st.lists(
    st.one_of(
        st.text(max_size=30),
        st.builds(
            lambda k, v: f"{k}={v}",
            st.sampled_from(["job", "gpus", "count", "host", "reason", "gpu", ""]),
            st.one_of(st.text(max_size=20), st.from_regex(r"[0-9,\-]{0,12}", fullmatch=True)),
        ),
    ),
    max_size=6,
)


@pytest.mark.slow
@given(_words)
def test_no_input_crashes_the_grammar(words: list[str]) -> None:
    try:
        parsed = parse_set_args(words)
    except InvalidInput as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    chosen = [parsed.gpus is not None, parsed.count is not None, parsed.cpu]
    assert sum(chosen) == 1
    if parsed.gpus is not None:
        assert len(set(parsed.gpus)) == len(parsed.gpus)
        assert all(g >= 0 for g in parsed.gpus)


def test_command_is_split_like_a_shell() -> None:
    parsed = parse_set_args(["job=t", "gpus=0", "command=python -m train --lr '3e-4 x'"])
    assert parsed.command == ("python", "-m", "train", "--lr", "3e-4 x")


@pytest.mark.parametrize("raw", ["", "'unterminated"])
def test_bad_command_is_refused(raw: str) -> None:
    with pytest.raises(InvalidInput, match="command="):
        parse_set_args(["job=t", "gpus=0", f"command={raw}"])
