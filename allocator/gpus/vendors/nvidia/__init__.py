"""NVIDIA GPUs over NVML: inventory, visibility, health, usage and topology."""

__all__: list[str] = []
