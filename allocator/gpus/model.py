"""Plain data describing GPUs, shared by inventory, health, records and placement.

The types are defined with the stored records (:mod:`allocator.records`), since
an agent publishes them and every reader decodes them strictly; this module
keeps the name the GPU layer has always imported them by.
"""

from __future__ import annotations

from allocator.records import GpuInfo, MigDevice

__all__ = ["GpuInfo", "MigDevice"]
