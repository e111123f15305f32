"""GPU inventory, health and worker-environment rendering."""
