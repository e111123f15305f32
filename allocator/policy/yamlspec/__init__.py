"""The policy's YAML field-spec engine: text to node tree, scalar and container kinds, a load's
state.
"""

__all__: list[str] = []
