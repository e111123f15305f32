"""The device layer's vendors: one folder each (``nvidia``, ``amd``, ``intel``,
``apple``), the only place its device library is imported, behind the one
interface of :mod:`allocator.gpus.vendors.base`; :mod:`allocator.gpus.vendors.registry`
names them and finds which one a host has."""

__all__: list[str] = []
