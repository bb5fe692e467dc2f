"""Node device registration values: ``hami.io/node-{type}-register`` (protocol.md section 1)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hami.protocol._ints import INT32_MAX, INT32_MIN, parse_go_bool, parse_int32
from hami.protocol.errors import ProtocolError

DEFAULT_MODE = "hami-core"
_WHAT = "node register value"
_FORBIDDEN = (",", ":")


@dataclass(frozen=True, slots=True)
class NodeDevice:
    """One device as a node registers it for the scheduler."""

    uuid: str
    count: int  # split count: containers that may share the device
    memory: int  # schedulable MiB, after memory scaling
    cores: int  # schedulable percent of one device, after core scaling
    model: str
    numa: int
    healthy: bool
    index: int = 0
    mode: str = DEFAULT_MODE


def encode_node_devices(devices: Iterable[NodeDevice]) -> str:
    """Write the 7-field form; every device, the last one too, ends with ``:``."""
    parts: list[str] = []
    for device in devices:
        for field, text in (("uuid", device.uuid), ("model", device.model)):
            if any(ch in text for ch in _FORBIDDEN):
                raise ProtocolError(_WHAT, f"{field} must not contain ',' or ':'", text)
        if device.uuid.lstrip().startswith("["):
            # A leading '[' would make readers take the whole value for the JSON form.
            raise ProtocolError(_WHAT, "uuid must not start with '['", device.uuid)
        healthy = "true" if device.healthy else "false"
        parts.append(
            f"{device.uuid},{device.count},{device.memory},{device.cores},"
            f"{device.model},{device.numa},{healthy}:"
        )
    return "".join(parts)


def decode_node_devices(value: str) -> list[NodeDevice]:
    """Read the 7-field, 9-field or JSON form. Any malformed part rejects the whole value."""
    if value.lstrip().startswith("["):
        return _decode_json(value)
    if ":" not in value:
        raise ProtocolError(_WHAT, "no device separator ':'", value)
    devices: list[NodeDevice] = []
    for segment in value.split(":"):
        if segment:
            devices.append(_decode_segment(segment, position=len(devices)))
    return devices


def _decode_segment(segment: str, *, position: int) -> NodeDevice:
    fields = segment.split(",")
    if len(fields) not in (7, 9):
        raise ProtocolError(_WHAT, f"a device has {len(fields)} fields, expected 7 or 9", segment)
    uuid, count, memory, cores, model, numa, healthy = fields[:7]
    index, mode = position, DEFAULT_MODE
    if len(fields) == 9:
        index = parse_int32(fields[7], what=_WHAT, field="index")
        if index < 0:
            raise ProtocolError(_WHAT, "index is negative", segment)
        mode = fields[8]
    if not uuid:
        raise ProtocolError(_WHAT, "uuid is empty", segment)
    return NodeDevice(
        uuid=uuid,
        count=_non_negative(count, "count"),
        memory=_non_negative(memory, "memory"),
        cores=_non_negative(cores, "cores"),
        model=model,
        numa=parse_int32(numa, what=_WHAT, field="numa"),
        healthy=parse_go_bool(healthy, what=_WHAT, field="healthy"),
        index=index,
        mode=mode,
    )


def _non_negative(text: str, field: str) -> int:
    value = parse_int32(text, what=_WHAT, field=field)
    if value < 0:
        raise ProtocolError(_WHAT, f"{field} is negative", text)
    return value


# JSON form (HAMi >= 2.8): keys matched case-insensitively, absent keys take zero values.
_JSON_INTS = {"index": "index", "count": "count", "devmem": "memory", "devcore": "cores"}


def _decode_json(value: str) -> list[NodeDevice]:
    try:
        items = json.loads(value)
    except (ValueError, RecursionError) as exc:
        # ValueError, not only JSONDecodeError: an integer literal over 4300 digits raises a
        # plain ValueError, which must be rejected like any other invalid JSON.
        raise ProtocolError(_WHAT, f"invalid JSON ({exc})", value) from None
    if not isinstance(items, list):
        raise ProtocolError(_WHAT, "JSON value is not an array", value)
    return [_decode_json_item(item, value) for item in items]


def _decode_json_item(item: Any, value: str) -> NodeDevice:
    if not isinstance(item, Mapping):
        raise ProtocolError(_WHAT, "JSON array item is not an object", value)
    lowered = {str(key).lower(): val for key, val in item.items()}
    ints: dict[str, int] = {}
    for key, field in _JSON_INTS.items():
        raw = lowered.get(key, 0)
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise ProtocolError(_WHAT, f"JSON key {key!r} is not an integer", value)
        if not INT32_MIN <= raw <= INT32_MAX:
            raise ProtocolError(_WHAT, f"JSON key {key!r} does not fit in int32", value)
        if raw < 0:
            raise ProtocolError(_WHAT, f"JSON key {key!r} is negative", value)
        ints[field] = raw
    numa = lowered.get("numa", 0)
    if isinstance(numa, bool) or not isinstance(numa, int) or not INT32_MIN <= numa <= INT32_MAX:
        raise ProtocolError(_WHAT, "JSON key 'numa' is not an int32", value)
    texts: dict[str, str] = {}
    for key in ("id", "type", "mode"):
        raw = lowered.get(key, "")
        if not isinstance(raw, str):
            raise ProtocolError(_WHAT, f"JSON key {key!r} is not a string", value)
        texts[key] = raw
    health = lowered.get("health", False)
    if not isinstance(health, bool):
        raise ProtocolError(_WHAT, "JSON key 'health' is not a boolean", value)
    if not texts["id"]:
        raise ProtocolError(_WHAT, "JSON device without 'id'", value)
    return NodeDevice(
        uuid=texts["id"],
        model=texts["type"],
        mode=texts["mode"],
        numa=numa,
        healthy=health,
        **ints,
    )
