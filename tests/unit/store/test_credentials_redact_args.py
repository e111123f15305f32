"""A command line as recorded: secret options and URL passwords masked, the rest as typed."""

from __future__ import annotations

import pytest

from allocator.cli.run import recorded_reason
from allocator.store.credentials import redact_args


@pytest.mark.parametrize(
    ("argv", "recorded"),
    [
        (["train.py", "--lr", "0.1"], ["train.py", "--lr", "0.1"]),
        (["x", "--token", "abc123"], ["x", "--token", "***"]),
        (["x", "--password=hunter22"], ["x", "--password=***"]),
        (["x", "--api-key", "k-1", "--epochs", "3"], ["x", "--api-key", "***", "--epochs", "3"]),
        (["env", "HF_TOKEN=hf_abc", "python"], ["env", "HF_TOKEN=***", "python"]),
        (["x", "https://bob:pw12@host/p?token=t9"], ["x", "https://bob:***@host/p?token=***"]),
        (["x", "--token"], ["x", "--token"]),  # nothing after it to hide
        (["x", "a b=c"], ["x", "a b=c"]),  # not a name=value
    ],
)
def test_what_is_masked(argv: list[str], recorded: list[str]) -> None:
    assert redact_args(argv) == recorded


def test_without_arguments_only_the_program_name_is_recorded() -> None:
    reason = recorded_reason(["/usr/bin/python3", "train.py", "s3cret"], record_args=False)
    assert reason == "allocator run: python3 (arguments not recorded)"
    assert len(recorded_reason(["x", *["word"] * 100])) == 200
