"""DesiredCache: the desired jobs are recomputed only when their inputs change."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from allocator.agent.planning.desired_cache import DesiredCache
from allocator.agent.planning.desired_inputs import DesiredInputs
from allocator.agent.planning.port_table import PortTable
from tests.unit.agent.planning.test_desired import FAIL_RULE, HOST, INVENTORY, assigned, with_rule


def cache(tmp_path: Path) -> DesiredCache:
    return DesiredCache(PortTable(tmp_path / "ports.json", lambda e, f: None), frozenset())


def inputs(revision: int = 5, unhealthy: dict[int, str] | None = None) -> DesiredInputs:
    return DesiredInputs(
        with_rule(FAIL_RULE),
        HOST,
        {"train": assigned(gpus=(1,))},
        {"train": revision},
        INVENTORY,
        unhealthy or {},
        {},
        policy_sha="sha",
    )


def test_the_same_inputs_are_not_computed_again(tmp_path: Path) -> None:
    wanted = cache(tmp_path)
    assert wanted.update(inputs()) == {}  # the jobs before: none
    first = wanted.desired
    assert wanted.update(inputs()) is None  # equal inputs, made anew
    assert wanted.desired is first
    assert wanted.update(dataclasses.replace(inputs(), policy_sha="sha-2")) is first


def test_a_failed_job_stays_failed_until_its_assignment_changes(tmp_path: Path) -> None:
    wanted = cache(tmp_path)
    wanted.update(inputs(unhealthy={1: "XID 79"}))
    assert [want.job for want in wanted.note_failed({"train": 5})] == ["train"]
    assert wanted.failed == {"train": 5}
    assert wanted.note_failed({"train": 5}) == []  # reported once
    assert wanted.note_failed({"train": 6}) == [] and wanted.failed == {}
