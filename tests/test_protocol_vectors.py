"""Every case of tests/data/protocol.json against the codec."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from _data import data_json

from hami.protocol import (
    ContainerDevice,
    NodeDevice,
    ProtocolError,
    decode_node_devices,
    decode_pod_devices,
    encode_node_devices,
    encode_pod_devices,
    handshake,
)

VECTORS: dict[str, Any] = data_json("protocol.json")


def _cases(section: str) -> list[Any]:
    cases = VECTORS[section]
    return [pytest.param(case, id=case.get("name", case.get("value", "?"))) for case in cases]


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def test_every_section_is_covered() -> None:
    expected = {
        "about",
        "node_register_decode",
        "node_register_encode",
        "handshake_parse",
        "handshake_availability",
        "pod_devices_decode",
        "pod_devices_encode",
    }
    assert set(VECTORS) == expected, "new vector sections need tests"


@pytest.mark.parametrize("case", _cases("node_register_decode"))
def test_node_register_decode(case: dict[str, Any]) -> None:
    if case.get("error"):
        with pytest.raises(ProtocolError):
            decode_node_devices(case["value"])
        return
    decoded = decode_node_devices(case["value"])
    # protocol.json predates MIG: its devices carry no mig_profiles (none of them has any).
    assert all(not d.mig_profiles for d in decoded)
    assert [asdict(d) | {"mig_profiles": ()} for d in decoded] == [
        d | {"mig_profiles": ()} for d in case["devices"]
    ]


@pytest.mark.parametrize("case", _cases("node_register_encode"))
def test_node_register_encode(case: dict[str, Any]) -> None:
    devices = [NodeDevice(**d) for d in case["devices"]]
    assert encode_node_devices(devices) == case["value"]


@pytest.mark.parametrize("case", _cases("handshake_parse"))
def test_handshake_parse(case: dict[str, Any]) -> None:
    parsed = handshake.parse_handshake(case["value"])
    assert parsed.state.value == case["state"]
    if "time" in case:
        assert parsed.time == _utc(case["time"])


@pytest.mark.parametrize("case", _cases("handshake_availability"))
def test_handshake_availability(case: dict[str, Any]) -> None:
    available = handshake.is_available(case["value"], _utc(case["now"]), timedelta(seconds=60))
    assert available is case["available"]


@pytest.mark.parametrize("case", _cases("pod_devices_decode"))
def test_pod_devices_decode(case: dict[str, Any]) -> None:
    if case.get("error"):
        with pytest.raises(ProtocolError):
            decode_pod_devices(case["value"])
        return
    decoded = decode_pod_devices(case["value"])
    assert [[asdict(d) for d in c] for c in decoded] == case["containers"]


@pytest.mark.parametrize("case", _cases("pod_devices_encode"))
def test_pod_devices_encode(case: dict[str, Any]) -> None:
    containers = [[ContainerDevice(**d) for d in c] for c in case["containers"]]
    assert encode_pod_devices(containers) == case["value"]
