"""The port of ROCr's ROCR_VISIBLE_DEVICES filter, case by case from amd_filter_device.cpp."""

from __future__ import annotations

import pytest

from allocator.gpus.vendors.amd.rocr_filter import rocr_uuid, token_problem, visible_devices

# Three GPUs in KFD order; the third reports no unique_id (ROCr's "Invalid-UUID").
UUIDS = [rocr_uuid(0x1122334455667788), rocr_uuid(0x11223344AABBCCDD), rocr_uuid(0)]


def test_rocr_names_a_gpu_by_its_kfd_unique_id_in_20_characters() -> None:
    assert UUIDS == ["GPU-1122334455667788", "GPU-11223344AABBCCDD", None]
    assert rocr_uuid(0xAB) == "GPU-00000000000000AB"  # zero-padded to 16 digits


@pytest.mark.parametrize(
    ("value", "seen"),
    [
        (None, [0, 1, 2]),  # unset: every GPU
        ("", []),  # set but empty: none
        ("-1", []),  # an index out of range ends the list at once
        ("2,0", [2, 0]),  # listed order is device order
        ("gpu-11223344aabbccdd,0", [1, 0]),  # upper-cased before matching
        (" GPU-1122334455667788 ", [0]),  # trimmed
        ("GPU-11223344A", [1]),  # a prefix of exactly one GPU's UUID
        ("GPU-11223344,0", []),  # a prefix of two: refused, and the list ends there
        ("0,GPU-1122334455667788", [0]),  # a GPU named twice ends the list
        ("1,7,0", [1]),  # out of range ends the list
        ("0x1,010", [1]),  # strtol base 0: hex; 010 is octal 8, out of range
        ("1,0,2,1", [1, 0, 2]),  # tokens past the GPU count are never read
        ("1,", [1]),  # a trailing comma adds no token
    ],
)
def test_tokens(value: str | None, seen: list[int]) -> None:
    assert visible_devices(value, UUIDS) == seen


def test_amdsmis_36_character_uuid_is_refused_and_hides_every_gpu() -> None:
    long_form = "GPU-11ff74a1-0000-1000-8022-334455667788"
    assert visible_devices(f"{long_form},0", UUIDS) == []
    assert "20 characters" in (token_problem(long_form) or "")


def test_token_problem() -> None:
    assert token_problem("GPU-1122334455667788") is None
    assert token_problem("3") is None
    assert token_problem("GPU-") is not None  # under 5 characters
    assert token_problem("0,1") is not None and token_problem("card0") is not None
