"""Under `-o json` a failing command's stderr is one JSON object (real processes, both stores)."""

from __future__ import annotations

import json
from pathlib import Path

from jsonschema import Draft202012Validator

from tests.e2e.conftest import Cli

ERROR_SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "schemas" / "error.schema.json"


def test_errors_under_json_are_one_json_object_on_stderr(applied: Cli) -> None:
    validator = Draft202012Validator(json.loads(ERROR_SCHEMA.read_text()))
    assert applied("set", "job=train", "gpus=1", "host=node1").code == 0
    refused = applied("set", "job=other", "gpus=1", "host=node1", "-o", "json")
    missing = applied("release", "job=ghost", "-o", "json")

    for result, code, name in ((refused, 3, "conflict"), (missing, 6, "not_found")):
        assert result.code == code and result.out == ""
        (line,) = result.err.splitlines()
        error = json.loads(line)
        assert list(validator.iter_errors(error)) == []
        assert (error["error"], error["exit_code"]) == (name, code)
    assert "held by job 'train'" in json.loads(refused.err)["message"]
