"""``allocator doctor``: what this host has, checked against the policy and PyTorch, as findings."""
