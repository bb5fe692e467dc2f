"""ResourceSlice and DeviceClass bodies for one backend on one node. Pure.

One pool per node and driver (pool name = node name), one slice holding it, one device per
physical device; an unhealthy one carries the ``hami.io/unhealthy`` device taint
(``taints``), or, where the API server does not serve taints, is left out. Each device is
shared (``allowMultipleAllocations``) through three consumable capacities, so
kube-scheduler itself keeps the sum of the claims on a device within it:

- ``memory``: the device memory as the node registers it (``memory_scaling`` applied), in
  MiB steps; a request that names no memory takes the whole device (HAMi's rule: a count
  without memory means 100 % of the memory);
- ``cores``: percent of compute (100 per device, ``core_scaling`` applied), at most 100 per
  claim; a request that names none takes the backend's default (NVIDIA 0 = no core limit,
  Cambricon MLU 100);
- ``slots``: the split count; every allocation takes exactly one, so at most
  ``split_count`` claims share a device, as in the extender mode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hami.backends.base import Backend, Device
from hami.core.requests import parse_quantity
from hami.dra import names, taints
from hami.dra.attributes import detail_attributes

API_VERSION = "resource.k8s.io/v1"
MAX_CORES = 100
JSON = dict[str, Any]


def _attr_str(value: str) -> JSON:
    return {"string": value}


def _attr_int(value: int) -> JSON:
    return {"int": value}


def device_entry(backend: Backend, device: Device) -> JSON:
    """One device of the slice, from its registered (scaled) form, with its taints."""
    (node_device,) = backend.to_node_devices([device])
    memory = node_device.memory
    cores = node_device.cores
    default_cores = min(backend.default_cores, cores, MAX_CORES)
    entry: JSON = {
        "name": names.device_name(backend.type_word, device.index),
        "attributes": {
            "uuid": _attr_str(device.uuid),
            "model": _attr_str(device.model),
            "type": _attr_str(backend.type_word),
            "vendor": _attr_str(backend.vendor_word),
            "numa": _attr_int(device.numa),
            "index": _attr_int(device.index),
            "healthy": {"bool": device.healthy},
            **detail_attributes(device.details),
        },
        "capacity": {
            "memory": {
                "value": f"{memory}Mi",
                "requestPolicy": {
                    "default": f"{memory}Mi",
                    "validRange": {"min": "1Mi", "max": f"{memory}Mi", "step": "1Mi"},
                },
            },
            "cores": {
                "value": str(cores),
                "requestPolicy": {
                    "default": str(default_cores),
                    "validRange": {"min": "0", "max": str(min(cores, MAX_CORES)), "step": "1"},
                },
            },
            "slots": {
                "value": str(backend.settings.split_count),
                "requestPolicy": {"default": "1", "validValues": ["1"]},
            },
        },
        "allowMultipleAllocations": True,
    }
    device_taints = taints.device_taints(device)
    if device_taints:
        entry["taints"] = device_taints
    return entry


def slice_spec(
    node: str,
    backend: Backend,
    devices: Sequence[Device],
    generation: int,
    *,
    with_taints: bool = True,
) -> JSON:
    """The slice's spec. An unhealthy device is tainted (no new claim is placed on it;
    claims already prepared keep running); ``with_taints=False`` (an API server that drops
    taints) leaves it out of the slice instead, to the same effect."""
    ordered = sorted(devices, key=lambda d: d.index)
    shown = ordered if with_taints else [d for d in ordered if d.healthy]
    return {
        "driver": names.driver_name(backend.type_word),
        "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
        "nodeName": node,
        "devices": [device_entry(backend, d) for d in shown],
    }


def resource_slice(
    node: str,
    backend: Backend,
    devices: Sequence[Device],
    generation: int = 0,
    *,
    with_taints: bool = True,
) -> JSON:
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {
            "name": names.slice_name(node, backend.type_word),
            "labels": {"app.kubernetes.io/managed-by": "hami", "hami.io/node": node},
        },
        "spec": slice_spec(node, backend, devices, generation, with_taints=with_taints),
    }


def device_class(backend: Backend, extended_resource_name: str | None = None) -> JSON:
    """The DeviceClass claims name to get this backend's devices (selected by driver);
    ``extended_resource_name`` maps a plain extended resource onto it (DRAExtendedResource)."""
    driver = names.driver_name(backend.type_word)
    spec: JSON = {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]}
    if extended_resource_name:
        spec["extendedResourceName"] = extended_resource_name
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": driver, "labels": {"app.kubernetes.io/managed-by": "hami"}},
        "spec": spec,
    }


def _quantities(value: Any) -> Any:
    """Quantities as integers: the API server writes them back canonically (``81920Mi``
    comes back as ``80Gi``), which must not read as a change."""
    if isinstance(value, Mapping):
        return {k: _quantities(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_quantities(v) for v in value]
    if isinstance(value, str):
        try:
            return parse_quantity(value)
        except ValueError:
            return value
    return value


def _comparable(spec: Mapping[str, Any]) -> Any:
    out = dict(spec)
    pool = dict(out.get("pool") or {})
    pool.pop("generation", None)
    out["pool"] = pool
    out["devices"] = [
        {**taints.without_times(d), "capacity": _quantities(d.get("capacity") or {})}
        if isinstance(d, Mapping)
        else d
        for d in out.get("devices") or []
    ]
    return out


def next_slice(
    node: str,
    backend: Backend,
    devices: Sequence[Device],
    existing: Mapping[str, Any] | None,
    *,
    with_taints: bool = True,
) -> JSON | None:
    """What to write: None when ``existing`` (the slice as the API server has it) already
    says what the devices say, else the desired slice with the pool generation bumped past
    the existing one (a fresh slice starts at 0). Quantities compare by value, taints
    without the time the server stamps on them (kept on a rewrite)."""
    desired = resource_slice(node, backend, devices, 0, with_taints=with_taints)
    if existing is None:
        return desired
    old_spec = existing.get("spec") or {}
    if _comparable(old_spec) == _comparable(desired["spec"]):
        return None
    old_devices = old_spec.get("devices")
    if isinstance(old_devices, list):
        taints.keep_times(desired["spec"]["devices"], old_devices)
    old_generation = (old_spec.get("pool") or {}).get("generation")
    generation = old_generation + 1 if isinstance(old_generation, int) else 1
    desired["spec"]["pool"]["generation"] = generation
    meta = existing.get("metadata") or {}
    if meta.get("resourceVersion"):
        desired["metadata"]["resourceVersion"] = meta["resourceVersion"]
    return desired
