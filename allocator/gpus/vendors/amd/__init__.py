"""AMD GPUs over amdsmi, with ROCr's device filter and a fake amdsmi."""

__all__: list[str] = []
