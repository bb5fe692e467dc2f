"""Node device registration values: ``hami.io/node-{type}-register`` (protocol.md section 1).

Two writer forms (a per-backend setting, ``register_format``): ``seed``, the 7-field form,
and ``json``, byte for byte what Go HAMi >= 2.8's ``MarshalNodeDevices`` writes. The reader
takes the 7-field, 9-field and JSON forms with Go HAMi's own rules, except where
protocol.md §8 says this project rejects on purpose (negative counts, memory or cores).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hami.protocol._gojson import MinusZero, fold_key, parse_int_literal
from hami.protocol._ints import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    UINT32_MAX,
    UINT64_MAX,
    parse_go_bool,
    parse_int,
    parse_int32,
    shared_int,
)
from hami.protocol.errors import ProtocolError
from hami.protocol.mig import MigPlacement, MigProfile, encode_mig_profile
from hami.protocol.mig import go_string as _go_string

DEFAULT_MODE = "hami-core"
SEED = "seed"
JSON = "json"
REGISTER_FORMATS = (SEED, JSON)
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
    # A MIG GPU's profiles and legal placements (JSON form only; protocol.md section 10).
    mig_profiles: tuple[MigProfile, ...] = ()


def encode_register(devices: Iterable[NodeDevice], register_format: str = SEED) -> str:
    """The register value in the backend's configured form (``seed`` or ``json``)."""
    if register_format == JSON:
        return encode_node_devices_json(devices)
    if register_format == SEED:
        return encode_node_devices(devices)
    raise ProtocolError(_WHAT, "unknown register_format, expected seed or json", register_format)


def encode_node_devices(devices: Iterable[NodeDevice]) -> str:
    """Write the 7-field form; every device, the last one too, ends with ``:``."""
    parts: list[str] = []
    for device in devices:
        for field, text in (("uuid", device.uuid), ("model", device.model)):
            if any(ch in text for ch in _FORBIDDEN):
                raise ProtocolError(_WHAT, f"{field} must not contain ',' or ':'", text)
        if device.uuid.lstrip().startswith("["):
            # A leading '[' makes readers try the whole value as the JSON form first.
            raise ProtocolError(_WHAT, "uuid must not start with '['", device.uuid)
        if min(device.count, device.memory, device.cores) < 0:
            # protocol.md §8: readers reject negative numbers, so none is written.
            raise ProtocolError(_WHAT, "count, memory and cores must not be negative", repr(device))
        healthy = "true" if device.healthy else "false"
        parts.append(
            f"{device.uuid},{device.count},{device.memory},{device.cores},"
            f"{device.model},{device.numa},{healthy}:"
        )
    return "".join(parts)


# --------------------------------------------------------------------------- JSON writer


def encode_node_devices_json(devices: Iterable[NodeDevice]) -> str:
    """What Go HAMi's ``MarshalNodeDevices`` writes: keys in its struct order, zero values
    left out (``omitempty``), devices in the order given (callers sort by index)."""
    items: list[str] = []
    for device in devices:
        _check_writable(device)
        fields = [f'"id":{_go_string(device.uuid)}']
        for key, number in (
            ("index", device.index),
            ("count", device.count),
            ("devmem", device.memory),
            ("devcore", device.cores),
        ):
            if number:
                fields.append(f'"{key}":{number}')
        if device.model:
            fields.append(f'"type":{_go_string(device.model)}')
        if device.numa:
            fields.append(f'"numa":{device.numa}')
        if device.mode:
            fields.append(f'"mode":{_go_string(device.mode)}')
        if device.mig_profiles:
            profiles = ",".join(encode_mig_profile(p) for p in device.mig_profiles)
            fields.append(f'"migProfiles":[{profiles}]')
        if device.healthy:
            fields.append('"health":true')
        items.append("{" + ",".join(fields) + "}")
    return "[" + ",".join(items) + "]"


def _check_writable(device: NodeDevice) -> None:
    """Refuse what this project's reader would refuse (protocol.md §8), so a node never
    writes a value the scheduler rejects."""
    if not device.uuid:
        raise ProtocolError(_WHAT, "uuid is empty", repr(device))
    for field, value in (("count", device.count), ("memory", device.memory)):
        if not 0 <= value <= INT32_MAX:
            raise ProtocolError(_WHAT, f"{field} is outside 0..{INT32_MAX}", repr(device))
    if not 0 <= device.cores <= INT32_MAX:
        raise ProtocolError(_WHAT, f"cores is outside 0..{INT32_MAX}", repr(device))
    if not 0 <= device.index <= UINT64_MAX:
        raise ProtocolError(_WHAT, "index is outside an unsigned 64-bit integer", repr(device))
    if not INT64_MIN <= device.numa <= INT64_MAX:
        raise ProtocolError(_WHAT, "numa does not fit in int64", repr(device))
    if any(p.memory_mb < 0 or p.core < 0 for p in device.mig_profiles):
        raise ProtocolError(_WHAT, "a MIG profile's memoryMB or core is negative", repr(device))


# --------------------------------------------------------------------------- reader


def decode_node_devices(value: str) -> list[NodeDevice]:
    """Read the 7-field, 9-field or JSON form. Any malformed part rejects the whole value.

    A value starting with ``[`` (or JSON ``null``, Go's empty list) is JSON; when it is not
    valid JSON but reads as the comma form (an id starting with ``[``), that is what it is,
    as Go HAMi's comma reader takes it."""
    stripped = value.strip(" \t\r\n")
    if stripped == "null":
        return []
    if value.lstrip().startswith("["):
        try:
            return _decode_json(value)
        except ProtocolError:
            try:
                return _decode_fields(value)
            except ProtocolError:
                pass
            raise
    return _decode_fields(value)


def _decode_fields(value: str) -> list[NodeDevice]:
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
    # The 7-field form numbers devices by position (Go gives each index 0: protocol.md §8).
    index, mode = position, DEFAULT_MODE
    if len(fields) == 9:
        index = parse_int(fields[7], what=_WHAT, field="index", bits=64)
        if index < 0:
            raise ProtocolError(_WHAT, "index is negative", segment)
        mode = fields[8]
    # Interned: a pod's value names the same ids (hami.protocol.poddevices), and models
    # and modes repeat on every node; at 65,000 nodes the copies are tens of MiB.
    return NodeDevice(
        uuid=sys.intern(uuid),
        count=_non_negative(count, "count"),
        memory=shared_int(_non_negative(memory, "memory")),
        cores=_non_negative(cores, "cores"),
        model=sys.intern(model),
        numa=parse_int(numa, what=_WHAT, field="numa", bits=64),
        healthy=parse_go_bool(healthy, what=_WHAT, field="healthy"),
        index=index,
        mode=sys.intern(mode),
    )


def _non_negative(text: str, field: str) -> int:
    value = parse_int32(text, what=_WHAT, field=field)
    if value < 0:
        raise ProtocolError(_WHAT, f"{field} is negative", text)
    return value


# JSON form (HAMi >= 2.8), read as Go's encoding/json reads it into HAMi's DeviceInfo: keys
# matched ignoring case as Go folds it (the last one wins), unknown keys ignored, absent keys and
# ``null`` taking the zero value, integers only within their Go type, known keys of the
# wrong type rejecting the value.


class _Pairs(list[tuple[str, Any]]):
    """A JSON object with its keys in order, duplicates kept (Go: the last one wins)."""


Check = Callable[[Any, str], Any]


def _integer(low: int, high: int) -> Check:
    def check(raw: Any, key: str) -> int:
        if raw is None:
            return 0
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise ValueError(f"JSON key {key!r} is not an integer")
        if not low <= raw <= high:
            raise ValueError(f"JSON key {key!r} is outside {low}..{high}")
        if isinstance(raw, MinusZero):
            if low == 0:
                raise ValueError(f"JSON key {key!r} is -0, not an unsigned integer")
            return 0
        return raw

    return check


def _string(raw: Any, key: str) -> str:
    if raw is None:
        return ""
    if not isinstance(raw, str):
        raise ValueError(f"JSON key {key!r} is not a string")
    return raw


def _boolean(raw: Any, key: str) -> bool:
    if raw is None:
        return False
    if not isinstance(raw, bool):
        raise ValueError(f"JSON key {key!r} is not a boolean")
    return raw


def _anything(raw: Any, key: str) -> Any:
    return raw


def _list(item: Check) -> Check:
    def check(raw: Any, key: str) -> list[Any]:
        if raw is None:
            return []
        if isinstance(raw, _Pairs) or not isinstance(raw, list):  # _Pairs: a JSON object
            raise ValueError(f"JSON key {key!r} is not an array")
        return [item(entry, key) for entry in raw]

    return check


def _object(fields: Mapping[str, Check]) -> Check:
    def check(raw: Any, key: str) -> dict[str, Any]:
        if raw is None:
            return {name: field(None, name) for name, field in fields.items()}
        if not isinstance(raw, _Pairs):
            raise ValueError(f"JSON key {key!r} is not an object")
        given: dict[str, Any] = {}
        for name, val in raw:
            folded = fold_key(name)
            if folded in fields:
                given[folded] = val
        return {name: field(given.get(name), name) for name, field in fields.items()}

    return check


def _map(raw: Any, key: str) -> Any:
    if raw is not None and not isinstance(raw, _Pairs):
        raise ValueError(f"JSON key {key!r} is not an object")
    return raw


_INT32 = _integer(INT32_MIN, INT32_MAX)
_UINT32 = _integer(0, UINT32_MAX)
_PLACEMENT = _object({"start": _UINT32, "size": _UINT32})
_MIG_PROFILE = _object(
    {
        "name": _string,
        "memorymb": _INT32,
        "core": _INT32,
        "slicecount": _UINT32,
        "placements": _list(_PLACEMENT),
    }
)
_MIG_TEMPLATE = _object({"name": _string, "core": _INT32, "memory": _INT32, "count": _INT32})
_DEVICE = _object(
    {
        "id": _string,
        "index": _integer(0, UINT64_MAX),
        "count": _INT32,
        "devmem": _INT32,
        "devcore": _INT32,
        "type": _string,
        "numa": _integer(INT64_MIN, INT64_MAX),
        "mode": _string,
        "migprofiles": _list(_MIG_PROFILE),
        "migtemplate": _list(_list(_MIG_TEMPLATE)),
        "health": _boolean,
        "devicevendor": _string,
        "custominfo": _map,
        "devicepairscore": _anything,  # json:"-" in Go: never read
    }
)


def _decode_json(value: str) -> list[NodeDevice]:
    try:
        items = json.loads(
            value,
            object_pairs_hook=_Pairs,
            parse_constant=_no_constant,
            parse_int=parse_int_literal,
        )
    except (ValueError, RecursionError) as exc:
        # ValueError, not only JSONDecodeError: an integer literal over 4300 digits raises a
        # plain ValueError, which must be rejected like any other invalid JSON.
        raise ProtocolError(_WHAT, f"invalid JSON ({exc})", value) from None
    if items is None:
        return []
    if isinstance(items, _Pairs) or not isinstance(items, list):
        raise ProtocolError(_WHAT, "JSON value is not an array", value)
    return [_decode_json_item(item, value) for item in items]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _decode_json_item(item: Any, value: str) -> NodeDevice:
    if item is None:
        # Go's reader takes a null item and its NVIDIA scheduler then crashes on it.
        raise ProtocolError(_WHAT, "JSON array item is null", value)
    if not isinstance(item, _Pairs):
        raise ProtocolError(_WHAT, "JSON array item is not an object", value)
    try:
        fields = _DEVICE(item, "device")
    except ValueError as exc:
        raise ProtocolError(_WHAT, str(exc), value) from None
    for key in ("count", "devmem", "devcore"):
        if fields[key] < 0:
            raise ProtocolError(_WHAT, f"JSON key {key!r} is negative", value)
    return NodeDevice(
        uuid=fields["id"],
        count=fields["count"],
        memory=fields["devmem"],
        cores=fields["devcore"],
        model=fields["type"],
        numa=fields["numa"],
        healthy=fields["health"],
        index=fields["index"],
        mode=fields["mode"],
        mig_profiles=_mig_profiles(fields["migprofiles"], value),
    )


def _mig_profiles(items: list[dict[str, Any]], value: str) -> tuple[MigProfile, ...]:
    """The decoded ``migProfiles``; a negative memoryMB or core rejects the value (§8: as
    the memory and cores a reservation holds, it would add room)."""
    profiles: list[MigProfile] = []
    for item in items:
        for key in ("memorymb", "core"):
            if item[key] < 0:
                raise ProtocolError(_WHAT, f"MIG profile JSON key {key!r} is negative", value)
        placements = tuple(MigPlacement(p["start"], p["size"]) for p in item["placements"])
        profiles.append(
            MigProfile(
                name=sys.intern(item["name"]),
                memory_mb=item["memorymb"],
                core=item["core"],
                slice_count=item["slicecount"],
                placements=placements,
            )
        )
    return tuple(profiles)
