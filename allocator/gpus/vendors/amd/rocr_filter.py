"""ROCr's ``ROCR_VISIBLE_DEVICES`` filter, ported (pure).

Follows ROCR-Runtime ``runtime/hsa-runtime/core/runtime/amd_filter_device.cpp``
(``RvdFilter::BuildRvdTokenList``, ``BuildDeviceUuidList``,
``ProcessUuidToken``, ``BuildUsrDeviceList``) and the loop in
``amd_topology.cpp`` that surfaces the listed GPUs in listed order. The
rules, as that code has them:

* unset: every GPU; set but empty: none;
* the value is split at commas, each token upper-cased and trimmed;
* a token starting with ``G`` is a UUID: 5 to 20 characters, matched as a
  prefix of exactly one GPU's ``GPU-`` + the 16 upper-case hex digits of its
  KFD ``unique_id`` (a GPU whose ``unique_id`` is 0 matches nothing);
* any other token is an index into the KFD's GPU nodes (``strtol`` with base
  0: ``0x10`` is hex, ``010`` octal);
* the first token that is rejected, out of range or repeated ends the list;
  tokens past the number of GPUs are never read.

The agent runs what it hands out through :func:`token_problem`, and tests
run whole worker environments through :func:`visible_devices`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["MAX_UUID_TOKEN", "rocr_uuid", "token_problem", "visible_devices"]

#: ``ProcessUuidToken`` refuses longer tokens: ``GPU-`` and 16 hex digits.
MAX_UUID_TOKEN = 20
_MIN_UUID_TOKEN = 5
# strtol(base 0) consuming the whole token: sign, then hex, octal or decimal.
_STRTOL_0 = re.compile(r"\s*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)\Z")


def rocr_uuid(unique_id: int) -> str | None:
    """ROCr's name for a GPU with this KFD ``unique_id`` (``None``: ROCr gives it none)."""
    if unique_id == 0:
        return None  # ROCr lists it as "Invalid-UUID", which no token matches
    return f"GPU-{unique_id:016X}"


def visible_devices(value: str | None, uuids: Sequence[str | None]) -> list[int]:
    """The KFD GPU indices a process sees, in its device order.

    ``uuids`` is :func:`rocr_uuid` of each GPU in KFD order.
    """
    if value is None:
        return list(range(len(uuids)))
    if value == "":
        return []
    tokens = [token.upper().strip() for token in _split(value)]
    chosen: list[int] = []
    for token in tokens[: len(uuids)]:
        index = _resolve(token, uuids)
        if index is None or not 0 <= index < len(uuids) or index in chosen:
            break  # ROCr stops at the first token it cannot use
        chosen.append(index)
    return chosen


def token_problem(token: str) -> str | None:
    """Why ROCr would refuse ``token`` whatever the GPUs (``None``: it may match)."""
    text = token.upper().strip()
    if text.startswith("G"):
        if not _MIN_UUID_TOKEN <= len(text) <= MAX_UUID_TOKEN:
            return (
                f"ROCr takes a UUID token of {_MIN_UUID_TOKEN}-{MAX_UUID_TOKEN} characters "
                f"(GPU- and the 16 hex digits of the KFD unique_id), not {len(text)}"
            )
        return None
    if not text or _STRTOL_0.match(text) is None:
        return "ROCr takes a device index or a GPU- UUID"
    return None


def _split(value: str) -> list[str]:
    # std::getline on ',' yields no token after a trailing comma.
    parts = value.split(",")
    return parts[:-1] if parts and parts[-1] == "" else parts


def _resolve(token: str, uuids: Sequence[str | None]) -> int | None:
    if token.startswith("G"):
        return _uuid_index(token, uuids)
    if token_problem(token) is not None:
        return None
    return _strtol(token)


def _uuid_index(token: str, uuids: Sequence[str | None]) -> int | None:
    if token_problem(token) is not None:
        return None
    matches = [n for n, uuid in enumerate(uuids) if uuid is not None and uuid.startswith(token)]
    return matches[0] if len(matches) == 1 else None  # two matches: ambiguous, refused


def _strtol(token: str) -> int:
    match = _STRTOL_0.match(token)
    assert match is not None  # token_problem checked it
    sign, digits = match.groups()
    if digits[:2] in ("0X", "0x"):
        number = int(digits[2:], 16)
    elif digits.startswith("0"):
        number = int(digits, 8)
    else:
        number = int(digits)
    return -number if sign == "-" else number
