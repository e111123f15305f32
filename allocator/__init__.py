"""allocator: a centralized, config-driven GPU device allocator.

The package root imports nothing heavy: the CLI and the agent start fast, and
only ``allocator.torch`` imports torch.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
