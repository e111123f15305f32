"""How often an idle agent talks to the store, paced by the size of the fleet (pure).

An idle agent makes two kinds of request: a lease keep-alive every
heartbeat, and a level-based re-read of its host every resync (the watches
carry every change; the re-read is the safety net). At the agent's own
settings (a 10 s heartbeat, a 30 s resync) a fleet of 12,500 agents sends
1,250 keep-alives and 417 re-reads a second, which cost etcd more than a
core through its JSON gateway. So the fleet's idle traffic has a ceiling,
as Nomad's servers bound heartbeats with ``max_heartbeats_per_second``:
past :data:`FLEET_KEEPALIVES_PER_SECOND` keep-alives (or
:data:`FLEET_RESYNCS_PER_SECOND` re-reads) a second, each agent's interval
grows with the fleet. The lease's TTL grows with the heartbeat, in the
ratio the agent's settings give (30 s to 10 s: three heartbeats), so an
agent found gone takes longer on a large fleet: about 3 minutes at 12,500
hosts, against Slurm's 5-minute ``SlurmdTimeout`` default.

The agent learns the fleet's size from the policy's common share
(``Policy.fleet_hosts``, written by ``policy apply``); the agent's own
settings stay the floor. A store with no shares (a policy applied by an
older version) paces at the agent's settings.
"""

from __future__ import annotations

from msgspec import Struct

from allocator.agent.config import AgentConfig

__all__ = ["FLEET_KEEPALIVES_PER_SECOND", "FLEET_RESYNCS_PER_SECOND", "Pacing", "pacing"]

#: The most lease keep-alives a second the whole fleet's idle agents send.
FLEET_KEEPALIVES_PER_SECOND = 200.0
#: The most periodic re-reads a second the whole fleet's idle agents make.
FLEET_RESYNCS_PER_SECOND = 20.0


class Pacing(Struct, frozen=True):
    """One agent's idle intervals, in seconds."""

    heartbeat_seconds: float
    lease_ttl: float
    resync_seconds: float


def pacing(config: AgentConfig, fleet_hosts: int) -> Pacing:
    """The intervals of one agent of a fleet of ``fleet_hosts`` (0: unknown, the settings')."""
    heartbeat = max(config.heartbeat_seconds, fleet_hosts / FLEET_KEEPALIVES_PER_SECOND)
    ttl = config.lease_ttl * heartbeat / config.heartbeat_seconds
    resync = max(config.resync_seconds, fleet_hosts / FLEET_RESYNCS_PER_SECOND)
    return Pacing(heartbeat, ttl, resync)
