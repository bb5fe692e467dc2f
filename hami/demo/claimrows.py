"""The DRA demo's placement table, in the extender demo's columns (``placement.HEADER``),
read from what kube-scheduler allocated: each container's entries in
``resources.claims`` name a request of the pod's claim, and each allocation result of that
request is one row (the device's uuid and model from hami's ResourceSlice, the memory and
cores from the result's ``consumedCapacity``). A MIG partition (``hami.dra.migslices``)
is not shared: its row has the profile's memory and cores from the slice, and the MIG
device the container sees when the caller knows it. A value that cannot be read shows
``?``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami.core.requests import parse_quantity
from hami.demo.placement import HEADER, status_of
from hami.dra.names import MIG_PROFILE

MIB = 1 << 20
DRIVER_SUFFIX = ".hami.io"
SHARED_AS = "HAMi-core"  # how a hami DRA driver shares a GPU
DeviceKey = tuple[str, str, str]  # (driver, pool, device name)
#: container name -> the MIG devices it sees (from its CDI environment), in order
Instances = Mapping[str, Sequence[str]]


@dataclass(frozen=True)
class SliceDevice:
    """What the table needs of one published device."""

    uuid: str
    profile: str = ""  # a MIG partition's profile; "" for a shared device
    memory: str = "?"  # MiB: a partition's (a shared device's comes from the claim)
    cores: str = "?"


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def slice_devices(slices: Iterable[Any]) -> dict[DeviceKey, SliceDevice]:
    """(driver, pool, device name) -> the device, for hami's drivers (a device without a
    ``uuid`` attribute is left out)."""
    out: dict[DeviceKey, SliceDevice] = {}
    for obj in slices:
        spec = _map(_map(obj).get("spec"))
        driver = str(spec.get("driver") or "")
        pool = str(_map(spec.get("pool")).get("name") or "")
        if not driver.endswith(DRIVER_SUFFIX):
            continue
        for device in map(_map, _list(spec.get("devices"))):
            attributes = _map(device.get("attributes"))
            uuid = _map(attributes.get("uuid")).get("string")
            if not isinstance(uuid, str):
                continue
            profile = _map(attributes.get(MIG_PROFILE)).get("string")
            capacity = {k: _map(v).get("value") for k, v in _map(device.get("capacity")).items()}
            out[(driver, pool, str(device.get("name") or ""))] = SliceDevice(
                uuid,
                profile if isinstance(profile, str) else "",
                _amount(capacity, "memory", MIB),
                _amount(capacity, "cores", 1),
            )
    return out


def _amount(amounts: Mapping[str, Any], name: str, unit: int) -> str:
    if amounts.get(name) is None:
        return "?"
    try:
        return str(-(-parse_quantity(amounts[name]) // unit))
    except ValueError:
        return "?"


def _results(claim: Mapping[str, Any], request: str | None) -> list[Mapping[str, Any]]:
    """The claim's allocation results for ``request`` (a ``firstAvailable`` subrequest's
    result is named ``{request}/{subrequest}``); every result when ``request`` is None."""
    allocation = _map(_map(claim.get("status")).get("allocation"))
    results = [_map(r) for r in _list(_map(allocation.get("devices")).get("results"))]
    if request is None:
        return results
    return [r for r in results if str(r.get("request") or "").split("/")[0] == request]


def pod_rows(
    name: str,
    request: str,
    pod: Mapping[str, Any],
    claims: Mapping[str, Mapping[str, Any]],
    devices: Mapping[DeviceKey, SliceDevice],
    model_of: Callable[[str], str],
    instances: Instances | None = None,
) -> list[list[str]]:
    """One row per device each container (init containers first) got from its claims.
    ``claims``: the claim's name in the namespace -> the ResourceClaim."""
    spec = _map(pod.get("spec"))
    node = str(spec.get("nodeName") or "-")
    status = status_of(pod)
    # the pod's claim entry -> the ResourceClaim made for it
    made = {
        str(s.get("name")): str(s.get("resourceClaimName"))
        for s in map(_map, _list(_map(pod.get("status")).get("resourceClaimStatuses")))
    }
    init = [_map(c) for c in _list(spec.get("initContainers"))]
    containers = [*init, *(_map(c) for c in _list(spec.get("containers")))]
    lines: list[list[str]] = []
    for position, container in enumerate(containers if node != "-" else []):
        cname = str(container.get("name") or position)
        label = f"{cname} (init)" if position < len(init) else cname
        who = name if len(containers) == 1 else f"{name}/{label}"
        seen = list((instances or {}).get(cname, ()))
        for entry in map(_map, _list(_map(container.get("resources")).get("claims"))):
            claim = claims.get(made.get(str(entry.get("name")), ""))
            wanted = entry.get("request")
            for result in _results(claim or {}, str(wanted) if wanted else None):
                key = (
                    str(result.get("driver")),
                    str(result.get("pool")),
                    str(result.get("device")),
                )
                device = devices.get(key, SliceDevice("?"))
                consumed = _map(result.get("consumedCapacity"))
                memory = _amount(consumed, "memory", MIB)
                cores = _amount(consumed, "cores", 1)
                shared, visible = SHARED_AS, device.uuid
                if device.profile:  # a whole MIG instance: its profile's size
                    memory, cores = device.memory, device.cores
                    shared = f"MIG {device.profile}"
                    visible = seen.pop(0) if seen else device.uuid
                model = model_of(device.uuid).removeprefix("NVIDIA-") if device.uuid != "?" else "?"
                lines.append([who, request, node, visible, model, memory, cores, shared, status])
    if not lines:
        lines.append([name, request, node, "-", "-", "-", "-", "-", status])
    for line in lines[1:]:
        line[1] = ""  # the request once per pod
    return lines


def placement_rows(
    pods: Mapping[str, Mapping[str, Any]],
    order: Sequence[tuple[str, str]],
    claims: Mapping[str, Mapping[str, Any]],
    devices: Mapping[DeviceKey, SliceDevice],
    model_of: Callable[[str], str],
    instances: Mapping[str, Instances] | None = None,
) -> list[list[str]]:
    """The header and every pod's rows, in ``order`` ((name, request) pairs);
    ``instances``: pod name -> what its containers see of their MIG devices."""
    rows = [list(HEADER)]
    for name, request in order:
        pod = pods.get(name)
        if pod is None:
            rows.append([name, request, "-", "-", "-", "-", "-", "-", "missing"])
            continue
        seen = (instances or {}).get(name)
        rows.extend(pod_rows(name, request, pod, claims, devices, model_of, seen))
    return rows
