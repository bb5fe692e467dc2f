"""The ``npu-smi`` readers on the outputs Huawei's command reference documents
(hami/testkit/npu_smi, each file naming its page), and on text that is not that layout."""

from __future__ import annotations

import pytest
from _ascend_helpers import FakeChip, answers, fixture, mapping, set_fields

from hami.backends import npu_smi
from hami.backends.npu_smi import ChipRef, NpuSmiError


def test_the_documented_mapping_lists_the_npu_chip_not_the_mcu() -> None:
    assert npu_smi.parse_mapping(fixture("info_m.txt")) == [ChipRef(0, 0, 0, "Ascend xxx")]


def test_the_documented_board_query() -> None:
    fields = npu_smi.parse_fields(fixture("board.txt"))
    assert npu_smi.int_field(fields, "NPU ID") == 0
    assert npu_smi.field(fields, "Chip Type") == "Ascend"
    assert npu_smi.field(fields, "Chip Name") == "xxx"
    die = npu_smi.field(fields, "Die ID")
    assert die == "V1,010A88C4 00A1A210 00000000 00000000 00180000"
    # the form DCMI's die id has in HAMi's ascend-device-plugin: 5 words, upper-case, '-'
    assert npu_smi.die_uuid(die) == "010A88C4-00A1A210-00000000-00000000-00180000"


def test_the_documented_health_and_phyid_queries() -> None:
    health = npu_smi.parse_fields(fixture("health.txt"))
    assert npu_smi.field(health, "Health Status") == npu_smi.HEALTHY
    assert npu_smi.field(health, "Error Code") == "NA"
    remap = npu_smi.parse_fields(fixture("phyid_remap.txt"))  # no space after the colon
    assert [npu_smi.int_field(remap, k) for k in ("Chip Physical ID", "NPU ID", "Chip ID")] == [
        0,
        0,
        0,
    ]


def test_the_stand_in_keeps_the_documented_layout() -> None:
    """With the page's own values, the stand-in npu-smi prints the page's text."""
    doc = FakeChip(0, 0, 0, 0, "xxx", "V1,010A88C4 00A1A210 00000000 00000000 00180000")
    for name, values in (
        ("board.txt", {"NPU ID": 0, "Chip ID": 0, "Chip Name": "xxx", "Die ID": doc.die}),
        ("health.txt", {"Health Status": "OK"}),
        ("phyid_remap.txt", {"Chip Physical ID": 0, "Chip Logic ID": 0, "NPU ID": 0}),
    ):
        assert set_fields(fixture(name), values) == fixture(name)
    rows = [("0", "0", "0", "Ascend xxx"), ("0", "1", "-", "Mcu")]
    assert mapping(rows) == fixture("info_m.txt")
    assert answers([doc])["info -m"] == fixture("info_m.txt")


def test_chips_come_in_logic_order_and_unusable_ones_are_skipped() -> None:
    text = mapping(
        [
            ("1", "0", "1", "Ascend 910B3"),
            ("1", "1", "-", "Mcu"),
            ("0", "0", "0", "Ascend 910B3"),
            ("-1", "0", "2", "Ascend 910B3"),  # documented: NPU ID -1 is not usable
        ]
    )
    assert [(c.npu, c.logic) for c in npu_smi.parse_mapping(text)] == [(0, 0), (1, 1)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no header line"),
        ("dcmi module initialize failed\n", "no header line"),
        (fixture("info_m.txt") + "        0   2\n", "needs 4 columns"),
        (fixture("info_m.txt") + "        x     0     0     Ascend 910B3\n", "must be integers"),
    ],
)
def test_a_mapping_not_in_the_documented_layout_is_refused(text: str, message: str) -> None:
    with pytest.raises(NpuSmiError, match=message):
        npu_smi.parse_mapping(text)


def test_fields_missing_or_malformed_are_named() -> None:
    with pytest.raises(NpuSmiError, match="no 'Key : value' lines"):
        npu_smi.parse_fields("\n\n")
    fields = npu_smi.parse_fields(fixture("health.txt"))
    with pytest.raises(NpuSmiError, match=r"no 'Die ID' line .found: Health Status"):
        npu_smi.field(fields, "Die ID")
    with pytest.raises(NpuSmiError, match="Error Code must be an integer, got 'NA'"):
        npu_smi.int_field(fields, "Error Code")


@pytest.mark.parametrize(
    "die",
    [
        "NA",  # what the MCU's board query prints
        "V1,010A88C4 00A1A210 00000000 00000000",
        "V1,010A88C4 00A1A210 00000000 00000000 0018000G",
        "V1,010A88C4 00A1A210 00000000 00000000 001800000",
    ],
)
def test_a_die_id_not_of_five_hex_words_is_refused(die: str) -> None:
    with pytest.raises(NpuSmiError, match="Die ID must be a tag and 5 hex words"):
        npu_smi.die_uuid(die)
