"""Every read command's ``-o json`` output matches its documented JSON Schema (docs/schemas/),
and under ``-o json`` stderr is JSON too: notes, warnings, and one error object."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from allocator.cli import main
from allocator.records.keys import KeyLayout
from allocator.store import open_store

REPO = Path(__file__).resolve().parents[3]
SCHEMAS = REPO / "docs" / "schemas"
EXAMPLE = REPO / "config" / "policy.example.yaml"


def _validator(name: str) -> Draft202012Validator:
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def _problems(name: str, document: Any) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in _validator(name).iter_errors(document)
    ]


@pytest.fixture
def store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """A SQLite store with the example policy applied and a little of everything in it."""
    url = f"sqlite://{tmp_path / 'store.db'}"
    for words in (
        ["policy", "apply", str(EXAMPLE), "--reason", "initial"],
        ["set", "job=train", "gpus=0,1", "host=node1", "reason=baseline"],
        ["set", "job=train", "gpus=0", "host=node1"],
        ["set", "job=notebook", "gpus=cpu", "host=node1"],
        ["set", "job=eval-nightly", "gpus=3", "host=node1"],
        ["set", "job=big", "count=2", "host=node2"],
        ["set", "job=spread", "gpus=1", "host=node1"],
        ["set", "job=spread", "gpus=4", "host=node2"],
        ["set", "job=gone", "gpus=5", "host=node2"],
        ["release", "job=gone", "reason=finished"],
        ["set", "job=group", "count=1", "host=node2,node3"],
    ):
        assert main([*words, "--store", url]) == 0
    capsys.readouterr()
    return url


def _json(capsys: pytest.CaptureFixture[str], *words: str, code: int = 0) -> Any:
    assert main([*words, "-o", "json"]) == code
    out = capsys.readouterr().out
    return json.loads(out)


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ("status", ["status"]),
        ("status", ["status", "host=node2"]),
        ("status", ["status", "pool=a100,default", "state=free,held"]),
        ("status-summary", ["status", "--summary"]),
        ("status-summary", ["status", "--summary", "state=held"]),
        ("get", ["get", "job=train"]),
        ("get", ["get", "job=spread"]),  # on two hosts: a list
        ("history", ["history"]),
        ("history", ["history", "job=train"]),
        ("policy-show", ["policy", "show"]),
        ("policy-diff", ["policy", "diff", str(EXAMPLE)]),
        ("env", ["env", "job=eval-nightly"]),
        ("get", ["get", "job=notebook"]),  # on the CPU
        ("get", ["get", "job=group"]),  # set across hosts at once: the group
        ("env", ["env", "job=group", "host=node3"]),
        ("queue", ["queue"]),
    ],
)
def test_read_commands_print_json_their_schema_describes(
    store: str, capsys: pytest.CaptureFixture[str], schema: str, words: list[str]
) -> None:
    document = _json(capsys, *words, "--store", store)
    assert _problems(schema, document) == []


def test_status_json_says_null_for_a_free_gpu_and_keeps_gpu_ids_strings(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = _json(capsys, "status", "host=node1", "--store", store)
    rows = {row["gpu"]: row for row in status["hosts"][0]["gpus"]}
    assert rows["2"]["holder"] is None and rows["2"]["since"] is None
    assert rows["0"]["holder"] == "train" and rows["cpu"]["holder"] == "notebook"
    assert rows["0"]["reason"] is None and rows["3"]["reserved"].startswith("nightly-eval")
    assert _problems("status", status) == []


def test_the_status_schema_refuses_the_tables_dash_for_a_free_gpu(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = _json(capsys, "status", "--store", store)
    status["hosts"][0]["gpus"][2]["holder"] = "-"
    status["hosts"][0]["gpus"][0]["gpu"] = 0
    assert len(_problems("status", status)) == 2


def test_history_json_names_places_and_keeps_gpu_ids_strings(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    entries = _json(capsys, "history", "host=node1", "job=train", "--store", store)["entries"]
    move, first = entries
    assert move["action"] == "move" and move["from"] == {"mode": "gpu", "gpus": ["0", "1"]}
    assert move["to"] == {"mode": "gpu", "gpus": ["0"]} and move["reason"] is None
    assert first["from"] is None and first["reason"] == "baseline"


def test_policy_validate_json_matches_its_schema_valid_invalid_or_warned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nhosts: {node1: {gpus: many}}\n")
    warned = tmp_path / "warned.yaml"
    warned.write_text("version: 1\nhosts: {node1: {gpus: 2}, NODE1: {gpus: 2}}\n")
    ok = _json(capsys, "policy", "validate", str(EXAMPLE))
    invalid = _json(capsys, "policy", "validate", str(bad), code=2)
    lint = _json(capsys, "policy", "validate", str(warned))
    assert (ok["valid"], invalid["valid"], lint["valid"]) == (True, False, True)
    assert lint["warnings"], "the example for warnings must warn"
    for document in (ok, invalid, lint):
        assert _problems("policy-validate", document) == []


def test_doctor_json_matches_its_schema(
    store: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ALLOCATOR_NVML", raising=False)
    document = _json(capsys, "doctor", "host=node1", "--no-torch", "--store", store, code=3)
    assert _problems("doctor", document) == []
    assert any(f["hint"] is None for f in document["findings"])


# --- stderr under -o json ------------------------------------------------------------------


def _stderr_objects(capsys: pytest.CaptureFixture[str]) -> tuple[str, list[dict[str, Any]]]:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    objects = [json.loads(line) for line in lines]
    for obj in objects:
        assert _problems("error", obj) == [], obj
    return captured.out, objects


@pytest.mark.parametrize(
    ("words", "code", "error", "fragment"),
    [
        (["set", "job=other", "gpus=0", "host=node1"], 3, "conflict", "held by job 'train'"),
        (["get", "job=ghost"], 6, "not_found", "holds nothing"),
        (["set", "job=x", "gpu=1"], 2, "invalid_input", "did you mean 'gpus'"),
        (["history", "--since", "5x"], 2, "invalid_input", "expected a duration"),
        (["frobnicate"], 2, "invalid_input", "invalid choice"),
        (["status", "--output", "json", "--bogus"], 2, "invalid_input", "--bogus"),
    ],
)
def test_an_error_under_json_is_one_json_object_on_stderr_and_nothing_on_stdout(
    store: str,
    capsys: pytest.CaptureFixture[str],
    words: list[str],
    code: int,
    error: str,
    fragment: str,
) -> None:
    assert main([*words, "--store", store, "-o", "json"]) == code
    out, objects = _stderr_objects(capsys)
    assert out == ""
    (only,) = objects
    assert (only["error"], only["exit_code"]) == (error, code)
    assert fragment in only["message"]


def test_an_unreachable_store_under_json_is_a_store_unavailable_object(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = f"sqlite://{tmp_path / 'nope' / 'x.db'}"
    assert main(["history", "--store", missing, "-ojson"]) == 4
    _, (only,) = _stderr_objects(capsys)
    assert only["error"] == "store_unavailable" and "does not exist" in only["message"]


def test_notes_under_json_are_json_lines_and_stdout_stays_the_document(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    damaged = f"{KeyLayout().host_history('node1')}{0:012d}"
    open_store(store).put(damaged, b"not json")
    assert main(["history", "--store", store, "--output=json"]) == 0
    out, objects = _stderr_objects(capsys)
    assert _problems("history", json.loads(out)) == []
    (note,) = objects
    assert set(note) == {"note"} and damaged in note["note"]


def test_without_json_errors_stay_one_plain_line(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["get", "job=ghost", "--store", store, "-o", "yaml", "-o", "table"]) == 6
    err = capsys.readouterr().err
    assert err.startswith("allocator: not found: ") and err.count("\n") == 1


def test_a_refused_policy_under_json_also_says_so_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nhosts: {node1: {gpus: many}}\n")
    assert main(["policy", "validate", str(bad), "-o", "json"]) == 2
    out, (only,) = _stderr_objects(capsys)
    assert json.loads(out)["valid"] is False
    assert only["error"] == "invalid_input" and "hosts.node1.gpus" in only["message"]


@pytest.mark.parametrize(
    "words",
    [
        ["set", "job=more", "count=1", "host=node1,node2"],
        ["set", "job=one", "gpus=cpu", "host=node1"],
        ["release", "job=group"],
        ["release", "job=notebook"],
    ],
)
def test_writes_print_the_records_get_prints(
    store: str, capsys: pytest.CaptureFixture[str], words: list[str]
) -> None:
    assert _problems("get", _json(capsys, *words, "--store", store)) == []


def test_policy_validate_prints_the_document_its_schema_describes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _problems("policy-validate", _json(capsys, "policy", "validate", str(EXAMPLE))) == []


def test_a_refused_policy_validates_as_a_document_and_an_error_object(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nhosts:\n  node1: {gpus: many}\n")
    assert main(["policy", "validate", str(bad), "-o", "json"]) == 2
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert document["valid"] is False and document["errors"][0]["line"] == 3
    assert _problems("policy-validate", document) == []
    (error,) = [json.loads(line) for line in captured.err.splitlines()]
    assert _problems("error", error) == [] and error["exit_code"] == 2


@pytest.mark.parametrize(
    ("words", "code"),
    [
        (["get", "job=nobody"], 6),
        (["set", "job=x", "gpus=99", "host=node1"], 2),
        (["set", "job=x", "gpus=0", "host=node1"], 3),
        (["status", "host=bad/name"], 2),
    ],
)
def test_every_error_under_json_is_one_error_object(
    store: str, capsys: pytest.CaptureFixture[str], words: list[str], code: int
) -> None:
    assert main([*words, "--store", store, "-o", "json"]) == code
    captured = capsys.readouterr()
    assert captured.out == ""
    (error,) = [json.loads(line) for line in captured.err.splitlines()]
    assert _problems("error", error) == [] and error["exit_code"] == code
