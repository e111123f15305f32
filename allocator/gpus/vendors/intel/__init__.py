"""Intel GPUs over sysfs and Level Zero's variables."""
