"""The compiled policy: what ``policy apply`` stores next to the YAML, and who may trust it."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest

from allocator.control.apply import compiled as compiled_policy
from allocator.control.client import Allocator
from allocator.errors import BadRecord
from allocator.placement.choose import Request
from allocator.policy import compiled as compiled_module
from allocator.policy import load_policy, policy_sha256
from allocator.policy.compiled import compile_policy, compiled_format, cut_parts, read_compiled
from allocator.records.keys import KeyLayout
from allocator.records.types import CompiledPolicyRecord
from allocator.status import applied_policy as applied_module
from allocator.status.part_cache import PartCache
from allocator.store import Read, Store, open_store
from allocator.util.digest import sha256_hex
from bench.bench_scale import ranged_policy
from bench.fleet import fleet_policy

EXAMPLE = (Path(__file__).resolve().parents[3] / "config" / "policy.example.yaml").read_text()
NOW = datetime(2026, 6, 1, tzinfo=UTC)
LAYOUT = KeyLayout()
KEY = LAYOUT.compiled_policy

#: Every part of the model at once: pools of each sharing mode, idle rules, reservations
#: with a window, fallback rules, environment, users, health and history settings.
RICH = """
version: 1
visible_devices: index
hosts:
  a: {gpus: 4}
  b: {gpus: 2, pool: shared}
pools:
  default: {hosts: [a], max_gpus_per_job: 3, idle: {after: 2h, action: warn}}
  shared: {sharing: {mode: mps, slots: 4}}
reservations:
  - {name: eval, host: a, gpus: [3], for: ["eval-*"],
     start: 2030-01-01T00:00:00Z, until: 2030-02-01T00:00:00+02:00}
fallback:
  cpu8: {action: cpu, threads: 8}
jobs:
  train:
    command: [python, train.py]
    env: {NCCL_DEBUG: INFO}
    workers: per-gpu
    on_change: signal:SIGHUP
    fallback: cpu8
    user: nobody
    exclusive: true
    cpu_affinity: none
    idle: {action: none}
health:
  ignored_xids: [13, 31, 79]
  recovery_probe: [nvidia-smi]
history:
  entries_per_host: 50
"""


@pytest.fixture
def store() -> Store:
    return open_store(f"memory://{uuid.uuid4().hex}")


def _allocator(store: Store, bad: list[BadRecord] | None = None) -> Allocator:
    sink = bad.append if bad is not None else None
    return Allocator(store, clock=lambda: NOW, actor="alice@h", on_bad_record=sink)


@pytest.mark.parametrize(
    "text", [EXAMPLE, RICH, fleet_policy(20)], ids=["example", "rich", "fleet"]
)
def test_a_compiled_policy_decodes_to_the_policy_its_yaml_loads(text: str) -> None:
    policy = load_policy(text)
    digest = policy_sha256(text)
    again = read_compiled(compile_policy(policy, digest), KEY, digest)
    assert again == policy
    assert again is not None and again.reservations == policy.reservations


def test_a_compiled_record_of_another_policy_text_is_ignored() -> None:
    raw = compile_policy(load_policy(EXAMPLE), policy_sha256(EXAMPLE))
    assert read_compiled(raw, KEY, policy_sha256(RICH)) is None


def test_a_compiled_record_of_another_format_is_ignored_not_reported() -> None:
    digest = policy_sha256(EXAMPLE)
    # An older or newer loader's record: even a body this one cannot decode is no bad record.
    other = CompiledPolicyRecord(digest, "0:0.0.1:feedfacefeedface", msgspec.Raw(b'{"v":[]}'))
    assert read_compiled(other.to_json(), KEY, digest) is None


def test_the_format_changes_when_a_model_field_changes_type(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from allocator.policy import model

    before = compiled_module._model_fingerprint()
    monkeypatch.setattr(model.Host, "__annotations__", {**model.Host.__annotations__, "gpus": str})
    assert compiled_module._model_fingerprint() != before


def test_the_format_names_this_allocators_version() -> None:
    from allocator import __version__

    assert f":{__version__}:" in compiled_format()


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b'{"schema_version": 1, "sha256": "x"}',
        b'{"schema_version": 2, "sha256": "x", "format": "f", "policy": {}}',
    ],
    ids=["garbage", "wrong-fields", "newer-schema"],
)
def test_a_damaged_compiled_record_is_a_bad_record(raw: bytes) -> None:
    with pytest.raises(BadRecord) as caught:
        read_compiled(raw, KEY, policy_sha256(EXAMPLE))
    assert caught.value.key == KEY


def test_a_compiled_policy_of_the_wrong_types_is_a_bad_record() -> None:
    digest = policy_sha256(EXAMPLE)
    body = msgspec.Raw(b'{"version": 1, "hosts": {"node1": {"name": "node1", "gpus": "four"}}}')
    raw = CompiledPolicyRecord(digest, compiled_format(), body).to_json()
    with pytest.raises(BadRecord, match="not a valid compiled policy"):
        read_compiled(raw, KEY, digest)


def test_apply_writes_the_compiled_policy_in_the_same_transaction(store: Store) -> None:
    _allocator(store).apply_policy(EXAMPLE, "p.yaml")
    policy_item, compiled_item = store.get(LAYOUT.policy), store.get(KEY)
    assert policy_item is not None and compiled_item is not None
    assert compiled_item.mod_revision == policy_item.mod_revision
    assert read_compiled(compiled_item.value, KEY, policy_sha256(EXAMPLE)) == load_policy(EXAMPLE)


def test_the_applied_policy_is_read_from_its_compiled_form(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    _allocator(store).apply_policy(EXAMPLE, "p.yaml")

    def no_yaml(*_args: object, **_kw: object) -> None:
        raise AssertionError("the YAML was parsed")

    monkeypatch.setattr("allocator.policy.loader.load_policy", no_yaml)
    snapshot = _allocator(store).require_policy()
    assert snapshot.policy == load_policy(EXAMPLE)


def test_set_works_on_a_store_with_only_the_yaml(store: Store) -> None:
    _allocator(store).apply_policy(EXAMPLE, "p.yaml")
    store.delete(KEY)
    bad: list[BadRecord] = []
    assignment, _ = _allocator(store, bad).assign(Request(job="train", host="node1", gpus=(1,)))
    assert assignment.gpus == (1,)
    assert bad == []


def _drop_shares(store: Store) -> None:
    """Leave only the compiled policy to read: ``set host=`` reads a host's share first."""
    (listing,) = store.read_many([Read(LAYOUT.shares, prefix=True, values=False)])
    for item in listing.items:
        store.delete(item.key)


def test_a_damaged_compiled_record_is_reported_and_the_yaml_read_instead(store: Store) -> None:
    _allocator(store).apply_policy(EXAMPLE, "p.yaml")
    _drop_shares(store)
    store.put(KEY, b'{"schema_version": 1, "sha256": "oops"}')
    bad: list[BadRecord] = []
    assignment, _ = _allocator(store, bad).assign(Request(job="train", host="node1", gpus=(2,)))
    assert assignment.gpus == (2,)
    assert [b.key for b in bad] == [KEY]


def test_a_compiled_record_left_from_another_policy_is_not_used(store: Store) -> None:
    _allocator(store).apply_policy(EXAMPLE, "p.yaml")
    other = EXAMPLE.replace("gpus: 4", "gpus: 16", 1)
    store.put(KEY, compile_policy(load_policy(other), policy_sha256(other)))
    assert _allocator(store).require_policy().policy == load_policy(EXAMPLE)


@pytest.mark.parametrize("damage", ["missing", "damaged"])
def test_reapplying_the_same_file_restores_the_compiled_policy(store: Store, damage: str) -> None:
    _allocator(store).apply_policy(EXAMPLE, "p.yaml")
    if damage == "missing":
        store.delete(KEY)
    else:
        store.put(KEY, b"{}")
    before = store.get(LAYOUT.policy)
    result = _allocator(store).apply_policy(EXAMPLE, "p.yaml")
    assert not result.changed and result.compiled
    item = store.get(KEY)
    assert item is not None
    assert read_compiled(item.value, KEY, policy_sha256(EXAMPLE)) == load_policy(EXAMPLE)
    assert store.get(LAYOUT.policy) == before  # the policy record itself is left alone


def test_a_current_compiled_policy_is_not_rewritten_by_a_reapply(store: Store) -> None:
    _allocator(store).apply_policy(EXAMPLE, "p.yaml")
    before = store.get(KEY)
    _allocator(store).apply_policy(EXAMPLE, "p.yaml")
    assert store.get(KEY) == before


def _parts(store: Store) -> set[str]:
    """The names (hashes) of the stored parts."""
    root = LAYOUT.compiled_parts_root
    return {kv.key[len(root) :] for kv in store.list(root).items}


def _no_yaml(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_yaml(*_args: object, **_kw: object) -> None:
        raise AssertionError("the YAML was parsed")

    monkeypatch.setattr("allocator.policy.loader.load_policy", no_yaml)


def test_a_policy_too_large_to_share_the_transaction_is_stored_in_parts(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compiled_policy, "TXN_VALUE_BUDGET", 1000)
    monkeypatch.setattr(compiled_policy, "PART_BYTES", 700)
    assert _allocator(store).apply_policy(EXAMPLE, "p.yaml").compiled
    item = store.get(KEY)
    assert item is not None
    head = msgspec.json.decode(item.value, type=CompiledPolicyRecord)
    assert head.parts > 1 and head.body_sha256 is not None
    assert len(head.part_sha256) == head.parts
    assert _parts(store) == set(head.part_sha256)
    with monkeypatch.context() as patch:
        _no_yaml(patch)
        assert _allocator(store).require_policy().policy == load_policy(EXAMPLE)


def test_stale_parts_are_dropped_but_the_previous_policys_are_kept_for_its_readers(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compiled_policy, "TXN_VALUE_BUDGET", 1000)
    monkeypatch.setattr(compiled_policy, "PART_BYTES", 700)
    texts = [EXAMPLE.replace("gpus: 4", f"gpus: {n}", 1) for n in (5, 6, 7)]
    seen = []
    for text in texts:
        _allocator(store).apply_policy(text, "p.yaml")
        head = msgspec.json.decode(store.get(KEY).value, type=CompiledPolicyRecord)  # type: ignore[union-attr]
        seen.append(set(head.part_sha256))
    assert seen[0] - seen[1]  # each apply changed a part
    assert _parts(store) == seen[1] | seen[2]


@pytest.mark.parametrize("damage", ["missing", "altered", "foreign"])
def test_parts_that_do_not_join_to_the_named_policy_are_never_used(
    store: Store, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    monkeypatch.setattr(applied_module, "PARTS", PartCache())  # kept parts of no other test
    monkeypatch.setattr(compiled_policy, "TXN_VALUE_BUDGET", 1000)
    monkeypatch.setattr(compiled_policy, "PART_BYTES", 700)
    other = EXAMPLE.replace("gpus: 4", "gpus: 16", 1)
    _allocator(store).apply_policy(other, "p.yaml")
    foreign = sorted(kv.key for kv in store.list(LAYOUT.compiled_parts_root).items)
    _allocator(store).apply_policy(EXAMPLE, "p.yaml")
    head = msgspec.json.decode(store.get(KEY).value, type=CompiledPolicyRecord)  # type: ignore[union-attr]
    first = LAYOUT.compiled_part(head.part_sha256[0])
    foreign = [key for key in foreign if key != first]
    if damage == "missing":
        store.delete(first)
    elif damage == "altered":
        store.put(first, b" " * 700)
    else:  # the first part of another compiled policy, put in place of this one's
        store.put(first, store.get(foreign[0]).value)  # type: ignore[union-attr]
    bad: list[BadRecord] = []
    assert _allocator(store, bad).require_policy().policy == load_policy(EXAMPLE)
    assert [b.key for b in bad] == [KEY]
    assert "part(s) are missing or damaged" in str(bad[0])


@pytest.mark.slow
def test_a_large_policy_applies_with_its_compiled_form_on_consul(consul_url: str) -> None:
    prefix = f"/t{uuid.uuid4().hex[:8]}"
    store = open_store(consul_url)
    try:
        allocator = Allocator(store, prefix=prefix, clock=lambda: NOW, actor="alice@h")
        # Alone its record fits Consul's 512 KiB transaction; with its compiled form it would not.
        text = fleet_policy(8000)
        assert allocator.apply_policy(text, "big.yaml").compiled
        assert allocator.require_policy().policy == load_policy(text)
    finally:
        store.close()


@pytest.mark.parametrize("data", [b"", b"abc", "policy: \u00e9".encode(), bytes(range(256)) * 999])
def test_sha256_hex_is_the_sha256_hashlib_computes(data: bytes) -> None:
    assert sha256_hex(data) == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    ("text", "host"),
    [(EXAMPLE, "node1"), (fleet_policy(12_000), "node0042")],
    ids=["example", "12000-hosts"],
)
def test_set_does_not_load_yaml_or_the_policy_loader(tmp_path: Path, text: str, host: str) -> None:
    url = f"sqlite://{tmp_path / 's.db'}"
    _allocator(open_store(url, create=True)).apply_policy(text, "p.yaml")
    probe = (
        "import json, sys\n"
        "from allocator.cli import main\n"
        f"code = main(['set', 'job=train', 'gpus=1', 'host={host}'])\n"
        "print(json.dumps({'code': code, 'modules': sorted(sys.modules)}), file=sys.stderr)\n"
    )
    env = {"ALLOCATOR_STORE": url, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=False
    )
    report = msgspec.json.decode(proc.stderr.strip().splitlines()[-1])
    assert report["code"] == 0, proc.stderr
    loaded = set(report["modules"])
    unwanted = {
        "yaml",
        "allocator.policy.loader",
        "allocator.policy.lint",
        "allocator.policy.spec",
        "allocator.policy.jobs_spec",
        "allocator.policy.hosts_spec",
        "allocator.control.across_hosts",
        "allocator.cli.policy",
        "allocator.cli.demo",
        "allocator.cli.status",
        "shutil",
        "tenacity",
        "hashlib",
        "difflib",
        "allocator.placement.ranking",
    }
    assert sorted(unwanted & loaded) == []


def test_set_on_a_damaged_compiled_policy_notes_it_once_and_succeeds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from allocator.cli import main

    url = f"sqlite://{tmp_path / 's.db'}"
    store = open_store(url, create=True)
    _allocator(store).apply_policy(EXAMPLE, "p.yaml")
    _drop_shares(store)
    store.put(KEY, b"not json")
    store.close()
    assert main(["--store", url, "set", "job=train", "gpus=1", "host=node1"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if KEY in line] == [err[0]]
    assert err[0].startswith("allocator: note: skipped bad record at")


def test_parts_are_cut_between_hosts_so_a_one_host_change_moves_few_of_them() -> None:
    before = load_policy(ranged_policy(3000))
    after = load_policy(ranged_policy(3000, exception_gpus=7))
    old, new = cut_parts(before, 4096), cut_parts(after, 4096)
    assert b"".join(old) == msgspec.json.encode(before)
    assert b"".join(new) == msgspec.json.encode(after)
    assert len(old) > 20 and max(map(len, old)) <= 4096
    # node0042's part (its entry leaves it for the end) and the last part.
    assert len(set(new) - set(old)) <= 2
