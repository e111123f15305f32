"""``python -m allocator`` runs the CLI."""

from allocator.cli import run

run()
