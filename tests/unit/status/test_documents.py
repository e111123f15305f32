"""`status -o json` is built straight from the rows and written by msgspec, yet says what it said.

The document used to be built with ``dataclasses.asdict`` and written with
``json.dumps(indent=2, sort_keys=True)``; it is now built field by field
and written by msgspec, many times faster on a fleet. These tests hold the
new path to the old one's output, for a fleet with every kind of row.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from allocator.cli.output import json_text
from allocator.policy.model import Host, IdleRule, Job, Policy, Pool, Reservation, Sharing
from allocator.records.gpu_info import GpuInfo
from allocator.records.keys import KeyLayout
from allocator.records.types import AgentRecord, Assignment, GpuProcess, WorkerRecord
from allocator.status.documents import status_document, status_host_json, status_json
from allocator.status.join import GpuRow, HostStatus, build_status, group_status
from allocator.store import KeyValue

NOW = datetime(2026, 6, 1, 14, 3, tzinfo=UTC)
LAYOUT = KeyLayout("/a")
POLICY = Policy(
    version=1,
    hosts={
        "n1": Host("n1", 4, pool="shared"),
        "n2": Host("n2", 2),
        "n3": Host("n3", 2),
        "n4": Host("n4", 2),
    },
    pools={
        "shared": Pool("shared", ("n1",), sharing=Sharing("mps", 4), idle=IdleRule(3600.0)),
    },
    jobs={"train": Job("train", ("x",)), "dist": Job("dist", ("y",))},
    reservations=(Reservation("nightly", "n2", (1,), ("eval-*",), until=NOW + timedelta(days=1)),),
)
#: The document's fields that say "none" with null, not the table's "" or "-".
GPU_OPTIONAL = (
    "holder",
    "since",
    "reason",
    "reserved",
    "outside_reservation",
    "slots",
    "idle",
    "user",
    "ends_at",
    "time_left",
)
JOB_OPTIONAL = (
    *("since", "by", "reason", "workers", "picked", "idle_rule", "log_path", "user"),
    "ends_at",
)


def _kv(key: str, record: Any, lease: int | None = None) -> KeyValue:
    raw = record if isinstance(record, bytes) else record.to_json()
    return KeyValue(key, raw, 3, 2, lease)


def _held(job: str, host: str, gpus: tuple[int, ...], **extra: Any) -> KeyValue:
    record = Assignment(job, host, gpus, "gpu", "ops@x", "2026-06-01T11:00:00Z", **extra)
    return _kv(LAYOUT.assignment(host, job), record)


def _fleet() -> list[KeyValue]:
    """Every kind of row status shows, and bad records among them."""
    dist = {"nodes": ("n2", "n3", "n4"), "master_port": 29500}
    return [
        # n1: a shared pool, slots, a whole-GPU holder, an idle holder, a stray process.
        _kv(
            LAYOUT.agent("n1"),
            AgentRecord(
                host="n1",
                gpus=tuple(GpuInfo(i) for i in range(4)),
                unhealthy={3: "XID 79"},
                unassigned=(GpuProcess(gpu=2, pid=4242, user="bob", memory_used_mib=512),),
            ),
            lease=9,
        ),
        _held("a", "n1", (0,), picked="NVLink pair", reason="tuning"),
        _held("b", "n1", (0,), slots=2),
        _held("c", "n1", (1,), exclusive=True),
        _kv(LAYOUT.assignment("n1", "d"), b'{"job": "d", "schema_version": 1'),  # cut short
        _kv(
            LAYOUT.workers("n1", "a"),
            WorkerRecord(
                job="a",
                host="n1",
                state="running",
                pids=(7,),
                gpus=(0,),
                idle_since="2026-06-01T12:00:00Z",
            ),
        ),
        _kv(
            LAYOUT.workers("n1", "b"),
            WorkerRecord(job="b", host="n1", state="running", pids=(8,), gpus=(1,)),
        ),
        # n2..n4: a job across hosts (n4's share is missing), a CPU job, a stale agent.
        _kv(LAYOUT.agent("n2"), AgentRecord(host="n2", gpus=(), store_stale=True), lease=9),
        _held("dist", "n2", (0, 1), **dist),
        _held("dist", "n3", (0, 1), **dist),
        _kv(
            LAYOUT.workers("n3", "dist"),
            WorkerRecord(job="dist", host="n3", state="backoff", message="exit 1"),
        ),
        _kv(
            LAYOUT.assignment("n3", "etl"),
            Assignment("etl", "n3", (), "cpu", "ops@x", "t", fallback_reason="no GPU free"),
        ),
        _kv(LAYOUT.agent("n4"), b"not json", lease=9),
        _kv(LAYOUT.workers("n9", "gone"), WorkerRecord(job="gone", host="n9", state="stopped")),
    ]


def _status() -> tuple[list[HostStatus], list[Any]]:
    hosts = build_status(POLICY, _fleet(), LAYOUT, NOW)
    return hosts, group_status(hosts)


def _document_the_old_way(hosts: list[HostStatus], groups: list[Any]) -> dict[str, Any]:
    """What status printed before: every field of every row, empty optional fields null."""

    def row(value: Any, optional: tuple[str, ...]) -> dict[str, Any]:
        data = msgspec.to_builtins(value)
        return {k: None if k in optional and v in ("", "-") else v for k, v in data.items()}

    return {
        "hosts": [
            {
                "host": h.host,
                "agent": h.agent,
                "gpus": [row(g, GPU_OPTIONAL) for g in h.gpus],
                "jobs": [row(j, JOB_OPTIONAL) for j in h.jobs],
                "bad_records": list(h.bad_records),
                "vendor": h.vendor,
                "vendor_mismatch": h.vendor_mismatch,
                "inventory": h.inventory,
            }
            for h in hosts
        ],
        "jobs_across_hosts": [msgspec.to_builtins(g) for g in groups],
        "revision": 41,
    }


def test_the_fleet_used_here_has_every_kind_of_row() -> None:
    hosts, groups = _status()
    by_name = {h.host: h for h in hosts}
    assert [g.slots for g in by_name["n1"].gpus][:2] == ["3/4 slots", "4/4 slots"]
    assert any(j.idle_holder for j in by_name["n1"].jobs)
    assert by_name["n1"].gpus[2].unassigned and by_name["n1"].bad_records
    assert by_name["n4"].bad_records and by_name["n2"].agent == "stale"
    assert [g.job for g in groups] == ["dist"] and groups[0].shares[2].gpus == ""
    assert any(g.gpu == "cpu" for g in by_name["n3"].gpus)


def test_status_document_equals_the_document_built_field_by_field() -> None:
    hosts, groups = _status()
    old = _document_the_old_way(hosts, groups)
    new = status_document(hosts, 41, groups)
    assert json.loads(json.dumps(new)) == json.loads(json.dumps(old))  # tuples are lists


def test_status_json_text_is_byte_for_byte_what_json_dumps_wrote() -> None:
    hosts, groups = _status()
    old = _document_the_old_way(hosts, groups)
    assert json_text(status_document(hosts, 41, groups)) == (
        json.dumps(old, indent=2, sort_keys=True) + "\n"
    )


def test_status_json_put_together_host_by_host_is_byte_for_byte_the_whole_document() -> None:
    hosts, groups = _status()
    pieces = [status_host_json(h) for h in hosts]
    whole = status_json(pieces, 41, groups)
    assert whole is not None
    assert b"".join(whole).decode() == json_text(status_document(hosts, 41, groups))
    one = status_json(pieces[:1], 7, [])
    assert one is not None
    assert b"".join(one).decode() == json_text(status_document(hosts[:1], 7, []))


def test_status_json_leaves_a_document_past_ascii_to_the_escaping_writer() -> None:
    hosts, groups = _status()
    odd = msgspec.structs.replace(hosts[0], bad_records=("caf\u00e9 \x7f",))
    assert status_json([status_host_json(h) for h in [odd, *hosts[1:]]], 41, groups) is None
    assert status_json([], 41, groups) is None  # no host: the whole document is written


def test_a_status_document_can_be_edited_without_changing_the_rows() -> None:
    hosts, groups = _status()
    document = status_document(hosts, 41, groups)
    document["hosts"][0]["gpus"][2]["unassigned"][0]["pid"] = 1
    document["hosts"][0]["jobs"][0]["job"] = "edited"
    again = status_document(hosts, 41, groups)
    assert again["hosts"][0]["gpus"][2]["unassigned"][0]["pid"] == 4242
    assert again["hosts"][0]["jobs"][0]["job"] == "a"


@pytest.mark.parametrize(
    "data",
    [
        {"reason": "caf\u00e9 \u2603", "n": 1},  # past ASCII: still \\u escapes
        {"reason": "del \x7f", "c1": "\x9b[2J"},  # DEL and a C1 control a terminal acts on
        {"esc": "\x1b[31m", "nl": "a\nb", "tab": "\t", "quote": '"', "slash": "\\/"},
        {"b": [], "a": {}, "c": [{"z": None, "y": True, "x": 1.5, "w": -0.0}]},
        {True: "json turns a bool key into text, msgspec refuses it"},
    ],
)
def test_json_text_writes_what_json_dumps_wrote(data: dict[Any, Any]) -> None:
    assert json_text(data) == json.dumps(data, indent=2, sort_keys=True) + "\n"


def test_a_gpu_row_keeps_its_fields_in_the_document() -> None:
    row = GpuRow("n1", "0", None, None, None, "ok", None)
    document = status_document([HostStatus("n1", "none", (row,), ())], 1)
    (host,) = json.loads(json_text(document))["hosts"]
    assert host["gpus"] == [
        {
            "host": "n1",
            "gpu": "0",
            "holder": None,
            "since": None,
            "reason": None,
            "health": "ok",
            "reserved": None,
            "outside_reservation": None,
            "slots": None,
            "idle": None,
            "idle_holder": False,
            "unassigned": [],
            "user": None,
            "ends_at": None,
            "time_left": None,
        }
    ]


def test_no_row_says_none_with_an_empty_string_or_the_tables_dash() -> None:
    # The rows are the document (written from the structs as they are): a field the
    # join leaves "" or "-" would reach `-o json` as such, not as null.
    hosts, groups = _status()
    document = json.loads(json_text(status_document(hosts, 41, groups)))
    gpus = [row for host in document["hosts"] for row in host["gpus"]]
    jobs = [row for host in document["hosts"] for row in host["jobs"]]
    for rows, optional in ((gpus, GPU_OPTIONAL), (jobs, JOB_OPTIONAL)):
        for name in optional:
            values = [row[name] for row in rows]
            # The fleet has a row without it (every job here has a since and a by)...
            assert None in values or name in ("since", "by"), name
            assert not {"", "-"} & set(values), (name, values)  # ...and says so with null
