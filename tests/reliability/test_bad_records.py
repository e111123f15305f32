"""Anything written under a host's keys never stops a well-formed job, nor the agent.

Hypothesis writes arbitrary bytes, arbitrary JSON, and records with the
right field names but wrong values, at the host's assignment keys (those of
running jobs included), its worker records, its agent key, the policy key
and odd key names, while two jobs run under a real agent on SQLite. After
each write the test writes a sentinel assignment and waits until the agent
has published what it made of it, so every example is really seen. Then:
the agent is up, both workers have the pids they started with, the agent's
own records are its own again, and at the end the agent still acts on a
real change. Key names that are not UTF-8 at all (written with the sqlite3
module, as ``etcdctl put`` could write them to etcd) are among them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from allocator.errors import BadRecord
from allocator.records.codec import decode_record
from allocator.records.types import AgentRecord, Assignment, PolicyRecord, WorkerRecord
from allocator.store import open_store
from tests.e2e.agent_harness import HOST, AgentHarness, pid_alive
from tests.reliability.conftest import Figures, scale
from tests.support.raw_store import put_raw_key
from tests.support.waiting import wait_for

_TEXT = st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=12)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=10,
)
_FIELDS = sorted(
    {
        f
        for kind in (Assignment, WorkerRecord, AgentRecord, PolicyRecord)
        for f in kind.__struct_fields__
    }
)
# Right field names (and usually the right schema_version), wrong or odd values.
_NEAR_RECORDS = st.dictionaries(st.sampled_from(_FIELDS), _JSON, max_size=8).map(
    lambda d: {"schema_version": 1, "host": HOST, **d}
)
VALUES = st.one_of(
    st.binary(max_size=64),
    _JSON.map(lambda v: json.dumps(v).encode()),
    _NEAR_RECORDS.map(lambda v: json.dumps(v).encode()),
)
KEYS = st.one_of(
    st.sampled_from(
        (
            *("jobs/train", "jobs/waiter", "jobs/crashy"),
            *("workers/train", "workers/ghost", "agent", "generation", "policy"),
        )
    ),
    _TEXT.map(lambda s: f"jobs/{s}"),
    _TEXT.map(lambda s: f"workers/{s}"),
    _TEXT,
)


def _not_utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return True
    return False


# Key names no UTF-8 decoder accepts, under the same places.
RAW_KEYS = st.tuples(
    st.sampled_from((b"jobs/", b"workers/", b"notes/", b"")),
    st.binary(min_size=1, max_size=12).filter(_not_utf8),
).map(lambda parts: parts[0] + parts[1])


@pytest.fixture
def busy(tmp_path: Path, prefix: str) -> Iterator[AgentHarness]:
    """An agent on SQLite running train (GPU 0) and waiter (GPU 1)."""
    with AgentHarness(tmp_path, f"sqlite://{tmp_path / 'store.db'}", prefix).running() as world:
        yield world


def _full_key(world: AgentHarness, key: str) -> str:
    return world.layout.policy if key == "policy" else world.layout.host(HOST) + key


def _usable(world: AgentHarness, key: str, value: bytes) -> bool:
    """Whether ``value`` is a well-formed assignment or policy where it is written."""
    full = _full_key(world, key)
    try:
        if key == "policy":
            decode_record(value, PolicyRecord, full)
            return True
        if key.startswith("jobs/"):
            decode_record(value, Assignment, full, job=key[5:], host=HOST)
            return True
    except BadRecord:
        pass
    return False


def _decoded(world: AgentHarness, key: str, kind: Any) -> Any:
    store = open_store(world.store_url)
    try:
        item = store.get(key)
    finally:
        store.close()
    try:
        return decode_record(item.value, kind, key) if item is not None else None
    except BadRecord:
        return None


def _sentinel(world: AgentHarness, step: int) -> int:
    record = Assignment(
        job="sentinel", host=HOST, gpus=(3,), mode="gpu", updated_by="t", updated_at=str(step)
    )
    return world.put_raw(world.layout.assignment(HOST, "sentinel"), record.to_json())


def test_no_written_record_stops_a_well_formed_job_or_the_agent(
    busy: AgentHarness, figures: Figures
) -> None:
    world = busy
    assert world.cli("set", "job=train", "gpus=0").code == 0
    assert world.cli("set", "job=waiter", "gpus=1").code == 0
    train, waiter = world.new_report("train"), world.new_report("waiter")
    examples, raw_keys = [0], [0]

    @settings(
        max_examples=scale(30, 1000),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(key=st.one_of(KEYS, RAW_KEYS), value=VALUES)
    def write_one(key: str | bytes, value: bytes) -> None:
        if isinstance(key, bytes):
            raw_keys[0] += 1
            put_raw_key(world.store_url, world.layout.host(HOST).encode() + key, value)
        else:
            assume(not _usable(world, key, value))
            world.put_raw(_full_key(world, key), value)
        examples[0] += 1
        revision = _sentinel(world, examples[0])

        def seen() -> bool:
            record = _decoded(world, world.layout.workers(HOST, "sentinel"), WorkerRecord)
            return record is not None and record.assignment_revision == revision

        wait_for(f"the agent to act on revision {revision}", seen)
        assert world.process is not None and world.process.poll() is None
        for report in (train, waiter):
            assert pid_alive(report["pid"])
        assert world.report("train") == train and world.report("waiter") == waiter
        # Its own records are its own again: put back after the read that saw the damage.
        mine = _decoded(world, world.layout.workers(HOST, "train"), WorkerRecord)
        assert mine is not None and mine.pids == (train["pid"],)
        assert _decoded(world, world.layout.agent(HOST), AgentRecord) is not None

    write_one()
    # Still acting on real changes: a new job starts.
    ranks = Assignment(
        job="ranks", host=HOST, gpus=(2,), mode="gpu", updated_by="t", updated_at="end"
    )
    world.put_raw(world.layout.assignment(HOST, "ranks"), ranks.to_json())
    world.new_report("ranks")
    assert [e["cause"] for e in world.events("start", job="train")] == ["new"]
    assert not any(world.events(e) for e in ("internal-error", "link-error", "store-error"))
    assert not world.events("store-unavailable")
    figures.add("records written", examples[0])
    figures.add("of them under key names that are not UTF-8", raw_keys[0])
    figures.add("bad records logged", len(world.events("bad-record")))
