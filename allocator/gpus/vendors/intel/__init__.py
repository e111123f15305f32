"""Intel GPUs over sysfs and Level Zero's variables."""

__all__: list[str] = []
