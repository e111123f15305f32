"""The fake amdsmi answers as amdsmi's binding does: codes, exceptions, derived ids."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocator.gpus.vendors.amd.fake_amdsmi import (
    AmdSmiLibraryException,
    AmdSmiRetCode,
    FakeAmdSmi,
    amdsmi_uuid,
)
from tests.support.fake_gpus import fake_device, write_fake_nvml


def test_status_codes_are_amdsmi_status_t() -> None:
    assert (AmdSmiRetCode.ERR_NOT_SUPPORTED, AmdSmiRetCode.ERR_NOT_FOUND) == (2, 31)
    assert (AmdSmiRetCode.NOT_INIT, AmdSmiRetCode.DRIVER_NOT_LOADED) == (32, 34)
    exc = AmdSmiLibraryException(-2)  # amdsmi keeps the absolute value
    assert exc.get_error_code() == 2
    assert str(exc) == "Error code:\n\t2 | AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported"


def test_uuid_is_amdsmi_uuid_gen_of_the_serial() -> None:
    # time_low = serial byte 7 | fcn 0xff | device id; clock = 0x80 | byte 6; node = bytes 5..0.
    assert amdsmi_uuid(0x0123456789ABCDEF, 0x74A1) == "01ff74a1-0000-1000-8023-456789abcdef"


def test_values_derive_from_the_kfd_unique_id(tmp_path: Path) -> None:
    path = write_fake_nvml(
        tmp_path / "amd.json",
        [fake_device(0, unique_id=0x0123456789ABCDEF, ecc_uncorrected=0), fake_device(1)],
        vendor="amd",
    )
    lib = FakeAmdSmi(path)
    lib.amdsmi_init()
    first, second = lib.amdsmi_get_processor_handles()
    assert lib.amdsmi_get_gpu_asic_info(first)["asic_serial"] == "0x0123456789ABCDEF"
    assert lib.amdsmi_get_gpu_device_uuid(first) == "01ff74a1-0000-1000-8023-456789abcdef"
    assert lib.amdsmi_get_gpu_total_ecc_count(first)["uncorrectable_count"] == 0
    with pytest.raises(AmdSmiLibraryException) as raised:  # no ECC count: no DRM, a VM guest
        lib.amdsmi_get_gpu_total_ecc_count(second)
    assert raised.value.get_error_code() == AmdSmiRetCode.ERR_NOT_SUPPORTED


def test_another_vendors_file_is_driver_not_loaded(tmp_path: Path) -> None:
    lib = FakeAmdSmi(write_fake_nvml(tmp_path / "nv.json", 1))
    with pytest.raises(lib.AmdSmiException) as raised:
        lib.amdsmi_init()
    assert isinstance(raised.value, AmdSmiLibraryException)
    assert raised.value.get_error_code() == AmdSmiRetCode.DRIVER_NOT_LOADED
