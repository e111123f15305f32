"""Pure placement decisions: requests, choosing and ranking GPUs, occupancy of shared GPUs,
reservations.
"""

__all__: list[str] = []
