"""What the DRA mode's objects say about devices and their usage, in the core's terms. Pure.

The node agent publishes one ResourceSlice per node and driver (``hami.dra.slices``);
kube-scheduler writes each claim's allocation results with the capacity it consumed. The
DRA-mode score keeps the same ``hami.core.cluster.Cluster`` picture the extender mode
keeps, fed from these instead of node and pod annotations:

- ``slice_devices``: a slice's devices as ``NodeDevice`` s, keyed by the device's name in
  the slice (``nvidia-0``): the name is what an allocation result names, unique within
  the node's pool of one driver, so a claim is counted even before its slice is seen;
- ``claim_holds``: an allocated claim's hold per node and device (one share, the consumed
  memory and cores), only for hami's drivers. An admin-access result (``adminAccess:
  true``: monitoring) holds nothing, as kube-scheduler counts it: its consumed capacity
  is recorded but never subtracted from the device.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hami.core.requests import parse_quantity
from hami.core.usage import Use
from hami.protocol import NodeDevice

MIB = 1 << 20
# A result without consumed capacity (not what hami's shared devices get) holds the device
# entirely: the picture fails closed, it never shows room kube-scheduler does not have.
WHOLE_MEMORY = 1 << 30
WHOLE_CORES = 100


@dataclass(frozen=True, slots=True)
class SliceDevices:
    node: str
    type_word: str
    devices: tuple[NodeDevice, ...]
    errors: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimHolds:
    # node -> device name -> what the claim holds there
    usage: Mapping[str, Mapping[str, Use]] = field(default_factory=dict)
    types: Mapping[str, str] = field(default_factory=dict)  # device name -> type word
    errors: tuple[str, ...] = ()


def object_ref(kind: str, obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    namespace = meta.get("namespace")
    name = meta.get("name", "?")
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


def _attr(attributes: Mapping[str, Any], name: str, form: str) -> Any:
    value = attributes.get(name)
    return value.get(form) if isinstance(value, Mapping) else None


def _capacity(capacity: Mapping[str, Any], name: str) -> int:
    entry = capacity.get(name)
    value = entry.get("value") if isinstance(entry, Mapping) else None
    if value is None:
        raise ValueError(f"no {name} capacity")
    return parse_quantity(value)


def _device(entry: Any, where: str) -> NodeDevice:
    if not isinstance(entry, Mapping) or not entry.get("name"):
        raise ValueError(f"{where}: a device without a name")
    name = str(entry["name"])
    attributes = entry.get("attributes")
    attributes = attributes if isinstance(attributes, Mapping) else {}
    capacity = entry.get("capacity")
    capacity = capacity if isinstance(capacity, Mapping) else {}
    try:
        memory = _capacity(capacity, "memory") // MIB
        cores = _capacity(capacity, "cores")
        slots = _capacity(capacity, "slots")
    except ValueError as exc:
        raise ValueError(f"{where} device {name!r}: {exc}") from None
    numa, index = _attr(attributes, "numa", "int"), _attr(attributes, "index", "int")
    healthy = _attr(attributes, "healthy", "bool")
    return NodeDevice(
        uuid=name,
        count=slots,
        memory=memory,
        cores=cores,
        model=str(_attr(attributes, "model", "string") or ""),
        numa=numa if isinstance(numa, int) and not isinstance(numa, bool) else 0,
        healthy=healthy is not False,
        index=index if isinstance(index, int) and not isinstance(index, bool) else 0,
    )


def slice_devices(obj: Mapping[str, Any], drivers: Mapping[str, str]) -> SliceDevices | None:
    """A ResourceSlice of one of hami's ``drivers`` (driver -> type word) as devices;
    None when it is another driver's or names no node. A device that cannot be read is
    left out, with an error naming the slice and the device."""
    spec = obj.get("spec") if isinstance(obj, Mapping) else None
    if not isinstance(spec, Mapping):
        return None
    word = drivers.get(str(spec.get("driver") or ""))
    node = spec.get("nodeName")
    if word is None or not isinstance(node, str) or not node:
        return None
    where = object_ref("ResourceSlice", obj)
    devices: list[NodeDevice] = []
    errors: list[str] = []
    entries = spec.get("devices")
    for entry in entries if isinstance(entries, list) else []:
        try:
            devices.append(_device(entry, where))
        except ValueError as exc:
            errors.append(str(exc))
    return SliceDevices(node, word, tuple(devices), tuple(errors))


def _use(result: Mapping[str, Any], at: str) -> tuple[Use, str | None]:
    consumed = result.get("consumedCapacity")
    if not isinstance(consumed, Mapping) or "memory" not in consumed:
        error = f"{at}: no consumed memory capacity; counted as holding the whole device"
        return Use(slots=1, memory=WHOLE_MEMORY, cores=WHOLE_CORES), error
    try:
        memory = -(-parse_quantity(consumed["memory"]) // MIB)
        cores = parse_quantity(consumed.get("cores", 0))
    except ValueError as exc:
        error = f"{at}: consumed capacity unreadable ({exc}); counted as the whole device"
        return Use(slots=1, memory=WHOLE_MEMORY, cores=WHOLE_CORES), error
    return Use(slots=1, memory=max(0, memory), cores=max(0, cores)), None


def claim_holds(obj: Mapping[str, Any], drivers: Mapping[str, str]) -> ClaimHolds:
    """What an allocated ResourceClaim holds on hami's devices; empty when it is not
    allocated or holds none of them."""
    status = obj.get("status") if isinstance(obj, Mapping) else None
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    if not isinstance(results, list):
        return ClaimHolds()
    where = object_ref("ResourceClaim", obj)
    usage: dict[str, dict[str, Use]] = {}
    types: dict[str, str] = {}
    errors: list[str] = []
    for i, result in enumerate(results):
        if not isinstance(result, Mapping):
            continue
        word = drivers.get(str(result.get("driver") or ""))
        if word is None or result.get("adminAccess") is True:
            continue
        at = f"{where} result {i} ({result.get('request', '?')})"
        pool, device = result.get("pool"), result.get("device")
        if not isinstance(pool, str) or not pool or not isinstance(device, str) or not device:
            errors.append(f"{at}: names no pool or device; not counted")
            continue
        use, error = _use(result, at)
        if error:
            errors.append(error)
        usage.setdefault(pool, {}).setdefault(device, Use()).add(use)
        types[device] = word
    return ClaimHolds(usage, types, tuple(errors))
