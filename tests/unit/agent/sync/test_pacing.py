"""An idle fleet's requests to the store stay under a ceiling at any size."""

from __future__ import annotations

import pytest

from allocator.agent.config import AgentConfig
from allocator.agent.sync.pacing import (
    FLEET_KEEPALIVES_PER_SECOND,
    FLEET_RESYNCS_PER_SECOND,
    pacing,
)

SETTINGS = AgentConfig(host="n1")


def test_a_small_or_unknown_fleet_paces_at_the_agents_own_settings() -> None:
    for hosts in (0, 1, 200, 600):
        paced = pacing(SETTINGS, hosts)
        assert (paced.heartbeat_seconds, paced.lease_ttl) == (10.0, 30.0)
    assert pacing(SETTINGS, 0).resync_seconds == 30.0


@pytest.mark.parametrize("hosts", [1_000, 2_000, 12_500, 25_000, 100_000])
def test_the_whole_fleets_idle_requests_stay_under_the_ceiling(hosts: int) -> None:
    paced = pacing(SETTINGS, hosts)
    assert hosts / paced.heartbeat_seconds <= FLEET_KEEPALIVES_PER_SECOND + 1e-9
    assert hosts / paced.resync_seconds <= FLEET_RESYNCS_PER_SECOND + 1e-9
    # The lease outlives three heartbeats, as the settings' 30 s to 10 s does.
    assert paced.lease_ttl == pytest.approx(3 * paced.heartbeat_seconds)


def test_at_12500_hosts_an_agent_found_gone_takes_about_three_minutes() -> None:
    paced = pacing(SETTINGS, 13_000)  # 12,500 hosts, as the apply rounds them
    assert paced.heartbeat_seconds == 65.0
    assert paced.lease_ttl == 195.0
    assert paced.resync_seconds == 650.0


def test_the_agents_own_longer_settings_stay_the_floor() -> None:
    slow = AgentConfig(host="n1", heartbeat_seconds=90.0, lease_ttl=270.0, resync_seconds=900.0)
    paced = pacing(slow, 12_500)
    assert (paced.heartbeat_seconds, paced.lease_ttl, paced.resync_seconds) == (90.0, 270.0, 900.0)
