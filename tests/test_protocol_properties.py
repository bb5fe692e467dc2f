"""Property tests: round trips, and garbage in never raises anything but ProtocolError."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami.protocol import (
    ContainerDevice,
    NodeDevice,
    ProtocolError,
    decode_node_devices,
    decode_pod_devices,
    encode_node_devices,
    encode_pod_devices,
    handshake,
    parse_lock,
)
from hami.protocol.nodelock import NodeLock

_text = st.text(
    alphabet=st.characters(blacklist_characters=",:;", blacklist_categories=("Cs",)), min_size=1
)
_u31 = st.integers(min_value=0, max_value=2**31 - 1)

node_devices = st.builds(
    NodeDevice,
    uuid=_text.filter(lambda u: not u.lstrip().startswith("[")),
    count=_u31,
    memory=_u31,
    cores=_u31,
    model=st.text(alphabet=st.characters(blacklist_characters=",:", blacklist_categories=("Cs",))),
    numa=st.integers(min_value=-(2**31), max_value=2**31 - 1),
    healthy=st.booleans(),
    index=st.just(0),
    mode=st.just("hami-core"),
)


@given(st.lists(node_devices, max_size=8))
def test_node_register_round_trip(devices: list[NodeDevice]) -> None:
    encoded = encode_node_devices(devices)
    if not devices:
        assert encoded == ""
        return
    decoded = decode_node_devices(encoded)
    # The 7-field form carries the position as the index.
    assert decoded == [_with_index(d, i) for i, d in enumerate(devices)]


def _with_index(device: NodeDevice, index: int) -> NodeDevice:
    return NodeDevice(
        uuid=device.uuid,
        count=device.count,
        memory=device.memory,
        cores=device.cores,
        model=device.model,
        numa=device.numa,
        healthy=device.healthy,
        index=index,
        mode=device.mode,
    )


container_devices = st.builds(
    ContainerDevice,
    uuid=_text,
    vendor=_text,
    memory=_u31,
    cores=st.integers(min_value=0, max_value=100),
)


@given(st.lists(st.lists(container_devices, max_size=4), max_size=6))
def test_pod_devices_round_trip(containers: list[list[ContainerDevice]]) -> None:
    assert decode_pod_devices(encode_pod_devices(containers)) == containers


@given(st.text())
def test_node_register_garbage_only_raises_protocol_error(value: str) -> None:
    try:
        decode_node_devices(value)
    except ProtocolError as exc:
        assert "invalid node register value" in str(exc)


@given(st.text(alphabet=st.sampled_from(list('[]{}",:;0123456789-truefalsGPU id'))))
def test_node_register_structured_garbage(value: str) -> None:
    # Anything but ProtocolError (KeyError, TypeError, RecursionError...) fails the test.
    with contextlib.suppress(ProtocolError):
        decode_node_devices(value)


@given(st.text())
def test_pod_devices_garbage_only_raises_protocol_error(value: str) -> None:
    try:
        decode_pod_devices(value)
    except ProtocolError as exc:
        assert "invalid pod devices value" in str(exc)


@given(st.text(), st.datetimes(timezones=st.just(UTC)))
def test_handshake_never_raises(value: str, now: datetime) -> None:
    decision = handshake.decide(value, has_register=True, now=now, timeout=timedelta(seconds=60))
    assert decision.available or decision.reason


def test_handshake_table() -> None:
    now = datetime(2024, 1, 10, 4, 7, 0, tzinfo=UTC)
    timeout = timedelta(seconds=60)

    def decide(value: str | None, has_register: bool = True) -> handshake.HandshakeDecision:
        return handshake.decide(value, has_register=has_register, now=now, timeout=timeout)

    stamp = "Requesting_2024-01-10 04:07:00"
    assert decide("Reported_2024-01-10 04:00:00") == handshake.HandshakeDecision(True, stamp, None)
    assert decide(None) == handshake.HandshakeDecision(True, stamp, None)
    assert decide(None, has_register=False).reason == "node unregistered"
    assert decide("Requesting_2024-01-10 04:06:00") == handshake.HandshakeDecision(True, None, None)
    stale = decide("Requesting_2024-01-10 04:05:59")
    assert stale == handshake.HandshakeDecision(False, None, "handshake timed out")
    assert not decide("Deleted_2024-01-10 04:06:00").available
    assert decide("garbage") == handshake.HandshakeDecision(True, stamp, None)


def test_node_lock_round_trip_and_staleness() -> None:
    now = datetime(2024, 5, 20, 10, 0, 0, tzinfo=UTC)
    lock = NodeLock(now, "default", "pod-a")
    assert lock.encode() == "2024-05-20T10:00:00Z,default,pod-a"
    assert parse_lock(lock.encode()) == lock
    assert not lock.is_expired(now + timedelta(minutes=5))
    assert lock.is_expired(now + timedelta(minutes=5, seconds=1))
    # Go writes RFC3339 with a zone offset too.
    assert parse_lock("2024-05-20T12:00:00+02:00,ns,p") == NodeLock(now, "ns", "p")


@pytest.mark.parametrize("value", ["", "junk", "2024-05-20T10:00:00Z,ns", "notatime,ns,p"])
def test_malformed_lock_is_none(value: str) -> None:
    assert parse_lock(value) is None


@pytest.mark.parametrize(
    ("device", "field"),
    [
        (NodeDevice("GPU:1", 10, 1, 100, "m", 0, True), "uuid"),
        (NodeDevice("GPU-1", 10, 1, 100, "a,b", 0, True), "model"),
        (NodeDevice("[GPU-1", 10, 1, 100, "m", 0, True), "uuid"),
    ],
)
def test_encode_rejects_separators(device: NodeDevice, field: str) -> None:
    with pytest.raises(ProtocolError, match=field):
        encode_node_devices([device])
