"""``allocator doctor``: what this host has, checked against the policy and PyTorch, as findings."""

__all__: list[str] = []
