"""The AMD reader's pure parts: amdsmi's values to ROCr's names."""

from __future__ import annotations

import pytest

from allocator.gpus.vendors.amd.vendor import rocr_uuid_of


@pytest.mark.parametrize(
    ("serial", "uuid"),
    [
        ("0x5E1F0A2B00000002", "GPU-5E1F0A2B00000002"),
        ("0x00000000000000ab", "GPU-00000000000000AB"),
        ("N/A", None),  # the card gave none
        ("0xFFFFFFFFFFFFFFFF", None),  # amdsmi's "not supported" default
        ("0x0000000000000000", None),  # ROCr's "Invalid-UUID"
    ],
)
def test_rocr_uuid_of_asic_serial(serial: str, uuid: str | None) -> None:
    assert rocr_uuid_of(serial) == uuid
