"""The CLI as operators use it: real processes, a real store."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.e2e.conftest import EXAMPLE_POLICY, Cli, Result, run_cli


def _one_line_error(result: Result, code: int, *fragments: str) -> None:
    assert result.code == code, (result.code, result.out, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert "Traceback" not in result.err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def _status(cli: Cli) -> dict[str, object]:
    result = cli("status", "-o", "json")
    assert result.code == 0, result.err
    data: dict[str, object] = json.loads(result.out)
    return data


def _holders(cli: Cli, host: str) -> dict[str, str | None]:
    hosts = _status(cli)["hosts"]
    assert isinstance(hosts, list)
    (entry,) = [h for h in hosts if h["host"] == host]
    return {row["gpu"]: row["holder"] for row in entry["gpus"]}


def test_set_get_status_release(applied: Cli) -> None:
    result = applied("set", "job=train", "gpus=0,1", "host=node1", "reason=baseline")
    assert result.code == 0, result.err
    assert "train@node1: gpus 0,1" in result.out

    got = applied("get", "job=train", "-o", "json")
    assert got.code == 0, got.err
    record = json.loads(got.out)
    assert record["gpus"] == [0, 1] and record["host"] == "node1"
    assert record["reason"] == "baseline" and "@" in record["updated_by"]
    assert record["schema_version"] == 1

    assert _holders(applied, "node1") == {"0": "train", "1": "train", "2": None, "3": None}
    table = applied("status")
    assert table.code == 0
    assert "HOST" in table.out and "train" in table.out and "nightly-eval" in table.out

    released = applied("release", "job=train")
    assert released.code == 0, released.err
    assert _holders(applied, "node1")["0"] is None
    _one_line_error(applied("get", "job=train"), 6, "holds nothing")


def test_moving_a_job_frees_its_old_gpus(applied: Cli) -> None:
    assert applied("set", "job=train", "gpus=0,1", "host=node1").code == 0
    assert applied("set", "job=train", "gpus=2", "host=node1").code == 0
    assert _holders(applied, "node1") == {"0": None, "1": None, "2": "train", "3": None}


def test_double_booking_is_refused_naming_the_holder(applied: Cli) -> None:
    assert applied("set", "job=train", "gpus=1", "host=node1").code == 0
    before = _status(applied)
    refused = applied("set", "job=other", "gpus=1,2", "host=node1")
    _one_line_error(refused, 3, "train", "GPU 1")
    assert _status(applied)["hosts"] == before["hosts"]


def test_reservation_is_refused_to_others_and_granted_to_matching_jobs(applied: Cli) -> None:
    _one_line_error(applied("set", "job=train", "gpus=3", "host=node1"), 3, "nightly-eval")
    assert applied("set", "job=eval-nightly", "gpus=3", "host=node1").code == 0


def test_count_picks_free_unreserved_gpus(applied: Cli) -> None:
    assert applied("set", "job=train", "gpus=0", "host=node1").code == 0
    result = applied("set", "job=notebook", "count=2", "host=node1", "-o", "json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["gpus"] == [1, 2]


def test_cpu_assignment(applied: Cli) -> None:
    result = applied("set", "job=train", "gpus=cpu", "host=node1", "-o", "json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["mode"] == "cpu"
    assert _holders(applied, "node1").get("cpu") == "train"


def test_bad_input_is_one_line_exit_2_and_writes_nothing(applied: Cli) -> None:
    before = _status(applied)
    for args, fragment in [
        (("set", "job=../x", "gpus=1", "host=node1"), "may contain only"),
        (("set", "job=t", "gpu=1"), "did you mean 'gpus'"),
        (("set", "job=t", "gpus=9", "host=node1"), "GPU 9"),
        (("set", "job=t", "gpus=1", "host=nosuch"), "nosuch"),
        (("set",), "job= is required"),
        (("frobnicate",), "invalid choice"),
        (("status", "--output", "xml"), "invalid choice"),
    ]:
        _one_line_error(applied(*args), 2, fragment)
    assert _status(applied)["hosts"] == before["hosts"]


def test_set_without_a_policy_says_how_to_apply_one(cli: Cli, store_url: str) -> None:
    # No SQLite store exists yet (exit 4: a read never creates one); etcd has no policy (2).
    code = 4 if store_url.startswith("sqlite://") else 2
    _one_line_error(cli("set", "job=t", "gpus=0"), code, "policy apply")


def test_policy_validate_reports_file_line_and_field(cli: Cli, tmp_path: Path) -> None:
    ok = cli("policy", "validate", str(EXAMPLE_POLICY))
    assert ok.code == 0, ok.err
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "version: 1\nhosts:\n  node1: {gpus: 4}\n"
        "jobs:\n  train:\n    command: [x]\n    fallback: nope\n"
    )
    _one_line_error(cli("policy", "validate", str(bad)), 2, "bad.yaml:7", "fallback", "nope")
    as_json = cli("policy", "validate", str(bad), "-o", "json")
    assert as_json.code == 2
    assert json.loads(as_json.out)["valid"] is False
    _one_line_error(cli("policy", "validate", str(tmp_path / "missing.yaml")), 2, "missing.yaml")


def test_policy_apply_show_diff(cli: Cli, tmp_path: Path, store_url: str) -> None:
    # Nothing applied: no SQLite store yet (4), or an etcd without the policy key (6).
    assert cli("policy", "show").code == (4 if store_url.startswith("sqlite://") else 6)
    applied = cli("policy", "apply", str(EXAMPLE_POLICY))
    assert applied.code == 0 and "applied" in applied.out
    again = cli("policy", "apply", str(EXAMPLE_POLICY))
    assert again.code == 0 and "unchanged" in again.out
    shown = cli("policy", "show", "-o", "json")
    assert shown.code == 0
    assert "node1" in json.loads(shown.out)["policy"]["hosts"]
    same = cli("policy", "diff", str(EXAMPLE_POLICY), "--exit-code")
    assert same.code == 0
    changed_file = tmp_path / "p.yaml"
    changed_file.write_text(EXAMPLE_POLICY.read_text().replace("gpus: 8", "gpus: 6", 1))
    diff = cli("policy", "diff", str(changed_file), "--exit-code")
    assert diff.code == 3 and "+  node2: {gpus: 6" in diff.out


def test_policy_apply_refuses_to_break_current_assignments(applied: Cli, tmp_path: Path) -> None:
    assert applied("set", "job=train", "gpus=7", "host=node2").code == 0
    smaller = tmp_path / "smaller.yaml"
    smaller.write_text(EXAMPLE_POLICY.read_text().replace("gpus: 8", "gpus: 6", 1))
    _one_line_error(applied("policy", "apply", str(smaller)), 3, "train@node2", "GPU 7")
    forced = applied("policy", "apply", str(smaller), "--force")
    assert forced.code == 0, forced.err
    assert "train@node2" in forced.err


def test_sixteen_processes_race_for_one_gpu_exactly_one_wins(
    applied: Cli, cli_env: dict[str, str]
) -> None:
    def contender(i: int) -> Result:
        return run_cli(["set", f"job=racer{i}", "gpus=2", "host=node1"], cli_env)

    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(contender, range(16)))
    winners = [r for r in results if r.code == 0]
    losers = [r for r in results if r.code != 0]
    assert len(winners) == 1, [(r.code, r.err) for r in results]
    assert all(r.code == 3 for r in losers), [(r.code, r.err) for r in losers]
    assert all("Traceback" not in r.err for r in results)
    holders = _holders(applied, "node1")
    winner = holders["2"]
    assert winner is not None and winner.startswith("racer") and "," not in winner
    listed = applied("status", "-o", "json")
    jobs = [j for h in json.loads(listed.out)["hosts"] for j in h["jobs"]]
    assert len(jobs) == 1
