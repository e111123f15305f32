"""The agent's pure decisions: desired jobs, the reconcile plan, worker environments and placement
on the host.
"""

__all__: list[str] = []
