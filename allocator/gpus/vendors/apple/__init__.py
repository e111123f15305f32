"""Apple silicon's one GPU, driven by PyTorch's MPS."""

__all__: list[str] = []
