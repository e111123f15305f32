"""Stored records are decoded strictly: types, ranges, schema_version, and key = body."""

from __future__ import annotations

import contextlib
import hashlib
import json
from datetime import UTC, datetime

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from allocator.errors import BadRecord
from allocator.records.codec import decode_record
from allocator.records.gpu_info import GpuInfo
from allocator.records.keys import KeyLayout
from allocator.records.types import AgentRecord, Assignment, PolicyRecord, WorkerRecord
from allocator.status.join import build_status
from allocator.status.snapshots import snapshots_by_host
from allocator.store import KeyValue

LAYOUT = KeyLayout("/t")
NOW = datetime(2026, 1, 1, tzinfo=UTC)
GOOD = Assignment("train", "node1", (1, 3), "gpu", "ops@x", "2026-01-01T00:00:00Z")


def _with(**changes: object) -> bytes:
    body = json.loads(GOOD.to_json())
    body.update(changes)
    return json.dumps(body).encode()


def test_a_record_round_trips_unchanged() -> None:
    assert Assignment.from_json(GOOD.to_json()) == GOOD
    agent = AgentRecord("node1", (GpuInfo(0, uuid="GPU-a"),), unhealthy={0: "XID 79"})
    assert AgentRecord.from_json(agent.to_json()) == agent


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"job": ["train"]}, "$.job"),
        ({"gpus": "1,3"}, "$.gpus"),
        ({"gpus": [1, "3"]}, "$.gpus[1]"),
        ({"gpus": [-1]}, "$.gpus[0]"),
        ({"gpus": [5000]}, "$.gpus[0]"),
        ({"fallback_reason": 7}, "$.fallback_reason"),
        ({"command": ["python", 3]}, "$.command[1]"),
        ({"mode": "gpus"}, "$.mode"),
        ({"policy_revision": "3"}, "$.policy_revision"),
        ({"job": "../x"}, "$.job"),
        ({"slots": 0}, "$.slots"),
        ({"slots": 257}, "$.slots"),
        ({"exclusive": "yes"}, "$.exclusive"),
    ],
)
def test_wrong_types_are_a_bad_record_naming_the_field(
    changes: dict[str, object], words: str
) -> None:
    with pytest.raises(BadRecord) as caught:
        decode_record(_with(**changes), Assignment, "/t/k")
    assert words in str(caught.value) and caught.value.key == "/t/k"


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"not json", "not valid JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"job": "train"}', "no schema_version"),
        (_with(schema_version=2), "schema_version 2"),
        (_with(schema_version="1"), "schema_version '1'"),
    ],
)
def test_unreadable_bodies_are_bad_records(raw: bytes, words: str) -> None:
    with pytest.raises(BadRecord, match=words):
        decode_record(raw, Assignment, "/t/k")


def test_a_body_naming_another_job_than_its_key_is_a_bad_record() -> None:
    with pytest.raises(BadRecord, match=r"job 'train' disagrees with the key.*'ghost'"):
        decode_record(GOOD.to_json(), Assignment, "/t/ghost", job="ghost", host="node1")
    with pytest.raises(BadRecord, match="host 'node1' disagrees"):
        decode_record(GOOD.to_json(), Assignment, "/t/k", job="train", host="node2")


def test_a_policy_record_without_its_hash_or_with_a_wrong_one_is_bad() -> None:
    text = "version: 1\n"
    good = PolicyRecord(text, hashlib.sha256(text.encode()).hexdigest(), "ops", "now")
    assert PolicyRecord.from_json(good.to_json()) == good
    body = json.loads(good.to_json())
    del body["sha256"]
    with pytest.raises(BadRecord, match="sha256"):
        PolicyRecord.from_json(json.dumps(body).encode())
    body["sha256"] = "0" * 64
    with pytest.raises(BadRecord, match="does not match the policy text"):
        PolicyRecord.from_json(json.dumps(body).encode())


def test_a_device_uuid_that_would_break_cuda_visible_devices_is_refused() -> None:
    agent = json.loads(AgentRecord("node1", (GpuInfo(0, uuid="GPU-a"),)).to_json())
    agent["gpus"][0]["uuid"] = "GPU-a,GPU-b"
    with pytest.raises(BadRecord, match="uuid"):
        AgentRecord.from_json(json.dumps(agent).encode())


def test_an_assignment_written_before_slots_existed_holds_one_slot() -> None:
    body = json.loads(GOOD.to_json())
    for field in ("slots", "exclusive", "picked"):
        del body[field]
    old = Assignment.from_json(json.dumps(body).encode())
    assert (old.slots, old.exclusive, old.picked) == (1, False, "")


def test_an_assignment_written_before_time_limits_existed_has_no_end() -> None:
    body = json.loads(GOOD.to_json())
    del body["ends_at"]
    assert Assignment.from_json(json.dumps(body).encode()).ends_at == ""


def test_an_assignment_keeps_its_end_time() -> None:
    ending = msgspec.structs.replace(GOOD, ends_at="2026-01-02T03:04:07Z")
    assert Assignment.from_json(ending.to_json()).ends_at == "2026-01-02T03:04:07Z"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("cpu_affinity", "0-3,x"),
        ("cpu_affinity", "0 1"),
        ("pcie_levels", [None, "pcie"]),
        ("pcie_levels", "switch"),
    ],
)
def test_a_gpus_topology_is_decoded_strictly(field: str, value: object) -> None:
    agent = json.loads(AgentRecord("node1", (GpuInfo(0, cpu_affinity="0-3"),)).to_json())
    agent["gpus"][0][field] = value
    with pytest.raises(BadRecord, match=field):
        AgentRecord.from_json(json.dumps(agent).encode())


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


@given(
    body=st.dictionaries(
        st.sampled_from([*json.loads(GOOD.to_json()), "x"]), JSON, max_size=12
    ).map(lambda d: {**json.loads(GOOD.to_json()), **d})
)
def test_any_json_decodes_or_is_a_bad_record_never_another_error(body: dict[str, object]) -> None:
    for kind in (Assignment, WorkerRecord, AgentRecord, PolicyRecord):
        with contextlib.suppress(BadRecord):
            decode_record(json.dumps(body).encode(), kind, "/t/k")


def test_fleet_reads_skip_a_bad_record_and_keep_every_other_host() -> None:
    good = KeyValue(LAYOUT.assignment("node1", "train"), GOOD.to_json(), 5, 5)
    ghost = KeyValue(LAYOUT.assignment("node1", "ghost"), GOOD.to_json(), 6, 6)
    broken = KeyValue(LAYOUT.workers("node2", "eval"), b'{"schema_version": 1, "job": 3}', 7, 7)
    other = Assignment("eval", "node2", (0,), "gpu", "ops", "t")
    fine = KeyValue(LAYOUT.assignment("node2", "eval"), other.to_json(), 8, 8)
    hosts = snapshots_by_host([good, ghost, broken, fine], LAYOUT, 9)
    assert set(hosts["node1"].assignments) == {"train"}
    assert [b.key for b in hosts["node1"].bad_records] == [ghost.key]
    assert set(hosts["node2"].assignments) == {"eval"} and hosts["node2"].workers == {}
    assert [b.key for b in hosts["node2"].bad_records] == [broken.key]
    rows = {h.host: h for h in build_status(None, [good, ghost, broken, fine], LAYOUT, NOW)}
    assert "disagrees with the key" in rows["node1"].bad_records[0]
    assert [g.holder for g in rows["node2"].gpus] == ["eval"]


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        # Bodies ending as this allocator writes records (`,"schema_version":1}`, the
        # shape decoded in one pass), or nearly: each is judged as any other body is.
        (b'[{"job": "train"},{"a":1,"schema_version":1}', "not a JSON object"),
        (b'{"job": "train", "x": [1,"schema_version":1}', "not valid JSON"),
        (b'{"job": 5,"schema_version":1}', "not a valid assignment"),
        (b'{"job": "t", "note": "\\",\\"schema_version\\":1}"}', "no schema_version"),
        (b'{"schema_version": 2, "job": "t","schema_version":1}', "not a valid assignment"),
    ],
)
def test_bodies_that_end_as_ours_are_still_checked(raw: bytes, words: str) -> None:
    with pytest.raises(BadRecord, match=words):
        decode_record(raw, Assignment, "/t/k")


def test_a_record_written_by_this_allocator_decodes_to_itself() -> None:
    raw = GOOD.to_json()
    assert raw.endswith(b',"schema_version":1}')  # the shape decoded in one pass
    assert decode_record(raw, Assignment, "/t/k", job="train", host="node1") == GOOD
    spaced = json.dumps(json.loads(raw), indent=1).encode()  # written by hand: checked path
    assert decode_record(spaced, Assignment, "/t/k", job="train", host="node1") == GOOD
