"""The agent's GPU state over the fake NVML: what survives a restart, and NVML failing."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from allocator.agent.gpu_care.care import GpuCare
from allocator.agent.gpu_care.state import GpuState
from allocator.agent.log import DecisionLog
from allocator.policy.model import HealthSettings, Host, Policy
from tests.support.clock import FakeClock
from tests.support.fake_gpus import FakeGpus

# Hold-down of 10 s; "stable" after 100 s in service.
POLICY = Policy(
    version=1,
    health=HealthSettings(hold_down_seconds=10.0, hold_down_max_seconds=100.0),
)


class Agent:
    """What the agent does with a GpuState: start it, check health, restart it."""

    def __init__(self, tmp_path: Path, gpus: FakeGpus, boot: str = "boot-1") -> None:
        self.path = tmp_path / "gpus.json"
        self.gpus = gpus
        self.clock = FakeClock(100.0)
        self.events: list[tuple[str, dict[str, object]]] = []
        self.state = self.start(boot)

    def start(self, boot: str = "boot-1") -> GpuState:
        """A (re)started agent's GPU state."""
        self.state = GpuState(self.gpus.environ, self.path, self.log, self.clock(), boot_id=boot)
        return self.state

    def log(self, event: str, fields: dict[str, object]) -> None:
        self.events.append((event, fields))

    def check(self, after: float = 1.0) -> dict[int, str]:
        self.clock.advance(after)
        return self.state.check(self.clock(), POLICY, "node1", None)

    def named(self, event: str) -> list[dict[str, object]]:
        return [fields for name, fields in self.events if name == event]


@pytest.fixture
def gpus(tmp_path: Path) -> FakeGpus:
    return FakeGpus(tmp_path / "nvml.json", 2)


def test_a_restarted_agent_keeps_a_gpu_it_took_out_of_service(
    tmp_path: Path, gpus: FakeGpus
) -> None:
    agent = Agent(tmp_path, gpus)
    agent.check()
    gpus.add_xid(1, 79)
    assert list(agent.check()) == [1]
    gpus.update(1, xid_events=[])  # the XID is history; NVML looks clean again
    agent.start()
    assert list(agent.state.unhealthy) == [1]  # in force before the first check
    assert list(agent.check()) == [1]
    assert agent.named("gpu-state-resumed")
    for _ in range(12):  # two clean checks, then the 10 s hold-down
        agent.check()
    assert agent.check() == {}


def test_a_counter_that_rose_while_the_agent_was_down_is_still_judged(
    tmp_path: Path, gpus: FakeGpus
) -> None:
    gpus.update(0, ecc_uncorrected=5)  # old errors: no news
    agent = Agent(tmp_path, gpus)
    assert agent.check() == {}
    agent.start()
    assert agent.check() == {}  # same count after a restart: still no news
    gpus.update(0, ecc_uncorrected=6)
    agent.start()
    assert "uncorrected ECC errors: 6 (was 5)" in agent.check()[0]


def test_state_saved_on_another_boot_is_ignored(tmp_path: Path, gpus: FakeGpus) -> None:
    agent = Agent(tmp_path, gpus)
    gpus.add_xid(1, 79)
    agent.check()
    gpus.update(1, xid_events=[])
    agent.start(boot="boot-2")  # rebooted: the GPUs were reset
    assert agent.state.unhealthy == {}
    assert agent.check() == {}


def test_a_swapped_gpu_starts_afresh(tmp_path: Path, gpus: FakeGpus) -> None:
    agent = Agent(tmp_path, gpus)
    gpus.add_xid(1, 79)
    agent.check()
    gpus.update(1, xid_events=[], uuid="GPU-11111111-2222-4333-8444-555555555555")
    agent.start()
    assert agent.state.unhealthy == {}


def test_nvml_failing_at_start_keeps_the_inventory_of_the_last_run(
    tmp_path: Path, gpus: FakeGpus
) -> None:
    agent = Agent(tmp_path, gpus)
    before = agent.state.inventory
    assert before.source == "fake" and before.gpus[0].uuid
    gpus.system["nvml_error"] = "unknown"
    gpus.save()
    agent.start()
    kept = agent.state.inventory
    assert kept.gpus == before.gpus  # the same UUIDs: no worker's environment changes
    assert kept.error is not None and "Unknown Error" in kept.error
    (failed,) = agent.named("nvml-inventory-failed")
    assert failed["kept_last_good"] is True


def test_a_failed_reload_keeps_the_inventory_and_retries(tmp_path: Path, gpus: FakeGpus) -> None:
    agent = Agent(tmp_path, gpus)
    before = agent.state.inventory
    gpus.system["nvml_error"] = "driver_not_loaded"
    gpus.save()
    assert agent.state.reload(None, agent.clock()).gpus == before.gpus  # SIGHUP
    assert agent.check() == {}  # NVML failing is no verdict on any GPU
    assert agent.named("nvml-health-failed")
    del gpus.system["nvml_error"]
    gpus.save()
    agent.check(after=5.0)  # the retry is due 5 s after the failure
    assert agent.named("nvml-inventory-recovered")
    assert agent.state.inventory.error is None
    assert agent.named("nvml-health-recovered")


def test_a_damaged_state_file_is_ignored(tmp_path: Path, gpus: FakeGpus) -> None:
    (tmp_path / "gpus.json").write_text("{not json")
    agent = Agent(tmp_path, gpus)
    assert agent.state.unhealthy == {} and agent.check() == {}


def test_an_idle_agent_does_not_rewrite_its_state_file(tmp_path: Path, gpus: FakeGpus) -> None:
    agent = Agent(tmp_path, gpus)
    agent.check()
    agent.path.write_bytes(agent.path.read_bytes())  # same bytes, new mtime
    stamp = agent.path.stat().st_mtime_ns
    for _ in range(3):
        agent.check()
    assert agent.path.stat().st_mtime_ns == stamp


def test_gpus_no_library_reads_are_the_vendor_the_policy_says(tmp_path: Path) -> None:
    # An AMD host whose amdsmi cannot answer: its workers still get AMD's variables.
    policy = Policy(version=1, hosts={"node1": Host("node1", 2, vendor="amd")})
    clock = FakeClock(100.0)
    log = DecisionLog("json", "node1", stream=io.StringIO())
    care = GpuCare({"ALLOCATOR_NVML": "off"}, tmp_path, log, clock())
    assert care.read_inventory(policy, "node1", clock()).vendor == "amd"
    clock.advance(60.0)
    care.state.check(clock(), policy, "node1", None)  # health checks re-read it
    assert (care.inventory.vendor, len(care.inventory.gpus)) == ("amd", 2)


def test_a_vendor_without_a_monitor_is_judged_by_fresh_inventory_reads(tmp_path: Path) -> None:
    agent = Agent(tmp_path, FakeGpus(tmp_path / "amd.json", 2, vendor="amd"))
    assert agent.state.inventory.vendor == "amd" and agent.state.monitor is None
    agent.gpus.update(1, lost=True)
    assert list(agent.check()) == [1]
    assert not agent.named("nvml-health-failed")
    agent.state.reload(None, agent.clock(), "amd")  # SIGHUP: nothing to re-open
    agent.state.close()
