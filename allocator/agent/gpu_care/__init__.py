"""The agent's care of its GPUs: health state, hold-down, recovery probes, MPS daemons, usage and
idle holders.
"""

__all__: list[str] = []
