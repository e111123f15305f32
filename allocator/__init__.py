"""allocator: a centralized, config-driven GPU device allocator.

The package root imports nothing heavy: the CLI and the agent start fast, and
only ``allocator.torch`` imports torch. ``allocator.lease`` (GPUs for this
Python process) is loaded on first use.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs every command milliseconds at start; mypy reads this
    from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "lease"]


def __getattr__(name: str) -> Any:
    """``allocator.lease``, imported only when used: ``import allocator`` stays cheap."""
    if name == "lease":
        # By name, not an import statement: the package root sits under every layer,
        # and what lease() loads (store, placement, the CLI's env builder) must not.
        import importlib

        return importlib.import_module("allocator.leasing").lease
    raise AttributeError(f"module 'allocator' has no attribute {name!r}")
