"""The JSON Schema: committed copy up to date, valid, and agreeing with the loader."""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.errors import InvalidName, PolicyError
from allocator.policy import load_policy, load_policy_file, policy_json_schema, policy_to_dict
from allocator.policy.yamlspec.kinds import NAME_PATTERN
from allocator.records.keys import validate_name

CONFIG = Path(__file__).resolve().parents[3] / "config"
SCHEMA_FILE = CONFIG / "policy.schema.json"
EXAMPLE = CONFIG / "policy.example.yaml"
VALIDATOR = jsonschema.Draft202012Validator(policy_json_schema())


def as_json(value: Any) -> Any:
    """What a YAML-to-JSON converter makes of loaded YAML (timestamps become strings)."""
    if isinstance(value, dict):
        return {str(key): as_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_json(item) for item in value]
    if isinstance(value, datetime.date):
        return value.isoformat()
    return value


def schema_errors(document: Any) -> list[str]:
    """Messages of every schema violation in ``document``."""
    return [error.message for error in VALIDATOR.iter_errors(as_json(document))]


def test_committed_schema_is_up_to_date() -> None:
    expected = json.dumps(policy_json_schema(), indent=2, sort_keys=True) + "\n"
    committed = SCHEMA_FILE.read_text(encoding="utf-8")
    assert committed == expected, (
        "config/policy.schema.json is out of date; regenerate it with "
        "`allocator policy schema > config/policy.schema.json`"
    )


def test_schema_is_valid_draft_2020_12() -> None:
    schema = policy_json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


def test_schema_is_a_fresh_copy_each_time() -> None:
    first = policy_json_schema()
    first["properties"].clear()
    assert policy_json_schema()["properties"]


def _properties(schema: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(schema, dict):
        for name, prop in schema.get("properties", {}).items():
            found.append((f"{path}.{name}", prop))
        for key, value in schema.items():
            if key != "properties":
                found.extend(_properties(value, path))
            else:
                for name, prop in value.items():
                    found.extend(_properties(prop, f"{path}.{name}"))
    elif isinstance(schema, list):
        for item in schema:
            found.extend(_properties(item, path))
    return found


def test_every_field_has_a_description() -> None:
    fields = [
        (path, prop)
        for path, prop in _properties(policy_json_schema())
        # the rule schemas (if/else) repeat field names only to constrain them
        if set(prop) - {"const", "type"}
    ]
    assert len(fields) > 30
    undocumented = [path for path, prop in fields if not prop.get("description")]
    assert undocumented == []


def test_example_validates_against_the_schema_and_loads() -> None:
    document = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    assert schema_errors(document) == []
    policy = load_policy_file(EXAMPLE)
    assert schema_errors(policy_to_dict(policy)) == []


def test_committed_schema_validates_the_example() -> None:
    committed = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    document = as_json(yaml.safe_load(EXAMPLE.read_text(encoding="utf-8")))
    jsonschema.validate(document, committed, cls=jsonschema.Draft202012Validator)


@pytest.mark.parametrize(
    "text",
    [
        "version: 2\n",
        "hosts: {}\n",
        "version: 1\nextra: 1\n",
        "version: 1\nhosts: {n: {gpus: -1}}\n",
        "version: 1\nhosts: {'a/b': {gpus: 1}}\n",
        "version: 1\nfallback: {w: {action: wait, threads: 2}}\n",
        "version: 1\nfallback: {c: {action: cpu, threads: 0}}\n",
        "version: 1\njobs: {a: {command: []}}\n",
        "version: 1\njobs: {a: {command: [x], on_change: reload}}\n",
        "version: 1\njobs: {a: {command: [x], env: {CUDA_VISIBLE_DEVICES: '0'}}}\n",
        "version: 1\njobs: {a: {command: [x], env: {ALLOCATOR_X: '0'}}}\n",
        "version: 1\nreservations: [{name: r, host: n, gpus: [1, 1], for: [x]}]\n",
        "version: 1\nhealth: {interval_seconds: 0}\n",
        "version: 1\nvisible_devices: name\n",
    ],
)
def test_schema_and_loader_both_refuse(text: str) -> None:
    assert schema_errors(yaml.safe_load(text)) != []
    with pytest.raises(PolicyError):
        load_policy(text)


# ECMA-262's $ means end of input; Python's also matches before a final
# newline, so names with a newline are left out of this comparison.
@given(st.text(alphabet=st.sampled_from("ab.-_Z09/ \u00e9*"), max_size=70))
def test_name_pattern_agrees_with_validate_name(name: str) -> None:
    try:
        validate_name(name)
        valid = True
    except InvalidName:
        valid = False
    assert bool(re.search(NAME_PATTERN, name)) == valid


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["restart", "none", "signal:SIGHUP", "signal:SIGUSR2", "signal:SIGTERM"]))
def test_on_change_values_the_loader_accepts_match_the_schema(value: str) -> None:
    text = f"version: 1\njobs: {{a: {{command: [x], on_change: '{value}'}}}}\n"
    load_policy(text)
    assert schema_errors(yaml.safe_load(text)) == []
