"""Which GPUs Level Zero shows a process, and in which order, given its environment.

A port of the rule Intel's Level Zero driver applies, for tests that ask
"does the runtime see exactly the assigned GPUs, in which order?":
``ExecutionEnvironment::parseAffinityMask`` in
``shared/source/execution_environment/execution_environment.cpp`` of
intel/compute-runtime (the code that parses ``ZE_AFFINITY_MASK``; the Level
Zero loader, oneapi-src/level-zero, passes the variable through untouched),
read with the Level Zero specification's "Affinity Mask" and "Device
Hierarchy" sections:

* unset, empty or ``default``: every device;
* the value splits on ``,``; an entry ``X`` selects device ``X`` whole,
  ``X.Y`` its sub-device (tile) ``Y`` alone; an index past the last device
  (or tile) is skipped without a word;
* the devices left keep the driver's order, whatever the mask's order (the
  driver walks its devices and keeps each one the mask enabled), and are
  renumbered from 0: ``ZE_AFFINITY_MASK=3,1`` makes GPU 1 device 0;
* ``ZE_ENABLE_PCI_ID_DEVICE_ORDER=1`` makes the driver's order PCI order;
  otherwise it is the order the driver discovered the cards in;
* ``ZE_FLAT_DEVICE_HIERARCHY``: ``COMPOSITE`` makes a card one device (its
  tiles are sub-devices); ``FLAT`` (the driver's default when unset) makes
  each tile of a multi-tile card a device of its own, numbered across cards,
  so the mask's indices count tiles, not cards.

Where the specification and the code differ (the spec calls an index past
the end an error left to the implementation; the driver skips it), this
follows the code. ``COMBINED`` and the engine-instanced ``X.Y.Z`` form are
left out: nothing here writes them. A token that is not a number raises
:class:`ValueError` (the driver's string-to-integer conversion would treat
it as some index); the allocator never writes one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Card", "Device", "level_zero_devices"]


@dataclass(frozen=True, slots=True)
class Card:
    """One Intel GPU as the driver finds it: its PCI address and how many tiles it has."""

    pci: str
    tiles: int = 1


@dataclass(frozen=True, slots=True)
class Device:
    """One device the process enumerates: which card, and which of its tiles."""

    pci: str
    tiles: tuple[int, ...]


def level_zero_devices(env: Mapping[str, str], discovered: Sequence[Card]) -> list[Device]:
    """The devices a process with ``env`` enumerates, ``xpu:0`` first.

    ``discovered`` is the host's cards in the order the driver found them.
    """
    cards = list(discovered)
    if env.get("ZE_ENABLE_PCI_ID_DEVICE_ORDER") == "1":
        cards.sort(key=lambda card: card.pci)
    hierarchy = env.get("ZE_FLAT_DEVICE_HIERARCHY", "FLAT")
    if hierarchy == "COMPOSITE":
        devices = [Device(card.pci, tuple(range(card.tiles))) for card in cards]
    elif hierarchy == "FLAT":
        devices = [Device(card.pci, (tile,)) for card in cards for tile in range(card.tiles)]
    else:
        raise ValueError(f"ZE_FLAT_DEVICE_HIERARCHY={hierarchy!r} is not modelled")
    mask = env.get("ZE_AFFINITY_MASK", "")
    if mask in ("", "default"):
        return devices
    enabled = _enabled(mask, devices)
    # The driver's order, not the mask's: it walks its devices and keeps the enabled ones.
    return [
        Device(device.pci, tuple(t for t in device.tiles if t in enabled[index]))
        for index, device in enumerate(devices)
        if enabled.get(index)
    ]


def _enabled(mask: str, devices: Sequence[Device]) -> dict[int, set[int]]:
    """Device index -> the tiles of it the mask enables."""
    enabled: dict[int, set[int]] = {}
    for entry in mask.split(","):
        index, *sub = (int(part) for part in entry.split("."))
        if index >= len(devices):
            continue
        tiles = devices[index].tiles
        if not sub:
            enabled.setdefault(index, set()).update(tiles)
        elif len(sub) == 1 and sub[0] < len(tiles):
            enabled.setdefault(index, set()).add(tiles[sub[0]])
    return enabled
