"""Readers of Huawei's ``npu-smi`` output, in the layouts its public command reference
documents (hiascend.com, "npu-smi 命令参考"; the pages are named in hami/testkit/npu_smi).

Pure: text in, plain values out; ``NpuSmiError`` says what was expected. Three layouts:

- ``npu-smi info -m``: a header line ``NPU ID  Chip ID  Chip Logic ID  Chip Name`` and one
  row per chip; a chip without a logic id (``-``) is the board's MCU, an NPU ID of -1 a
  chip that is not usable (both skipped).
- ``npu-smi info -t board|health -i N -c C`` and ``-t phyid-remap -p P``: ``Key : value``
  lines (the colon padded or not).
- The ``Die ID`` of the board query, ``V1,010A88C4 00A1A210 00000000 00000000 00180000``:
  five 32-bit words in hex after a version tag.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

HEALTHY = "OK"  # the documented states: OK, Warning, Alarm, Critical, UNKNOWN
_MAPPING_HEADER = ("NPU ID", "Chip ID", "Chip Logic ID", "Chip Name")
_WORD = re.compile(r"[0-9A-Fa-f]{1,8}")
DIE_WORDS = 5


class NpuSmiError(ValueError):
    """The text is not in the documented layout; the message names what is missing."""


@dataclass(frozen=True, slots=True)
class ChipRef:
    """One NPU chip as ``npu-smi info -m`` lists it."""

    npu: int  # NPU ID, the -i argument
    chip: int  # Chip ID, the -c argument
    logic: int  # Chip Logic ID
    name: str  # Chip Name as the mapping prints it ("Ascend 910B3")


def parse_mapping(text: str) -> list[ChipRef]:
    """The NPU chips of ``npu-smi info -m``, in logic-id order."""
    lines = [line for line in text.splitlines() if line.strip()]
    header = next((i for i, line in enumerate(lines) if _is_mapping_header(line)), None)
    if header is None:
        raise NpuSmiError(f"no header line {'  '.join(_MAPPING_HEADER)!r}")
    chips: list[ChipRef] = []
    for line in lines[header + 1 :]:
        fields = line.split(None, 3)
        if len(fields) < 4:
            raise NpuSmiError(f"a chip row needs 4 columns, got {line.strip()!r}")
        npu, chip, logic, name = fields
        if logic == "-":
            continue  # the board's MCU: no logic id, not an NPU
        try:
            ids = int(npu), int(chip), int(logic)
        except ValueError:
            raise NpuSmiError(f"ids must be integers in {line.strip()!r}") from None
        if ids[0] < 0:
            continue  # documented: NPU ID -1 marks a chip that is not usable
        chips.append(ChipRef(ids[0], ids[1], ids[2], name.strip()))
    return sorted(chips, key=lambda c: c.logic)


def _is_mapping_header(line: str) -> bool:
    words = " ".join(line.split())
    return words.startswith(" ".join(_MAPPING_HEADER))


def parse_fields(text: str) -> dict[str, str]:
    """The ``Key : value`` lines of a ``-t`` query (first occurrence of a key wins)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            fields.setdefault(" ".join(key.split()), value.strip())
    if not fields:
        raise NpuSmiError("no 'Key : value' lines")
    return fields


def field(fields: dict[str, str], key: str) -> str:
    value = fields.get(key)
    if value is None:
        raise NpuSmiError(f"no {key!r} line (found: {', '.join(fields) or 'none'})")
    return value


def int_field(fields: dict[str, str], key: str) -> int:
    value = field(fields, key)
    try:
        return int(value)
    except ValueError:
        raise NpuSmiError(f"{key} must be an integer, got {value!r}") from None


def die_uuid(die_id: str) -> str:
    """A chip's uuid from its Die ID: the five words upper-case, 8 hex digits each, joined
    with ``-``: the form DCMI's die id takes in HAMi's ascend-device-plugin."""
    _tag, _sep, words_text = die_id.rpartition(",")
    words = words_text.split()
    if len(words) != DIE_WORDS or not all(_WORD.fullmatch(w) for w in words):
        raise NpuSmiError(
            f"Die ID must be a tag and {DIE_WORDS} hex words "
            f"('V1,010A88C4 00A1A210 ...'), got {die_id!r}"
        )
    return "-".join(w.upper().zfill(8) for w in words)
