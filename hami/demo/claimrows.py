"""The DRA demo's placement table, in the extender demo's columns (``placement.HEADER``),
read from what kube-scheduler allocated: each container's entries in
``resources.claims`` name a request of the pod's claim, and each allocation result of that
request is one row (the device's uuid and model from hami's ResourceSlice, the memory and
cores from the result's ``consumedCapacity``). A value that cannot be read shows ``?``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from hami.core.requests import parse_quantity
from hami.demo.placement import HEADER, status_of

MIB = 1 << 20
DRIVER_SUFFIX = ".hami.io"
SHARED_AS = "HAMi-core"  # the only way a hami DRA driver shares a GPU
DeviceKey = tuple[str, str, str]  # (driver, pool, device name)


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def slice_uuids(slices: Iterable[Any]) -> dict[DeviceKey, str]:
    """(driver, pool, device name) -> the device's ``uuid`` attribute, for hami's drivers."""
    out: dict[DeviceKey, str] = {}
    for obj in slices:
        spec = _map(_map(obj).get("spec"))
        driver = str(spec.get("driver") or "")
        pool = str(_map(spec.get("pool")).get("name") or "")
        if not driver.endswith(DRIVER_SUFFIX):
            continue
        for device in _list(spec.get("devices")):
            uuid = _map(_map(_map(device).get("attributes")).get("uuid")).get("string")
            if isinstance(uuid, str):
                out[(driver, pool, str(_map(device).get("name") or ""))] = uuid
    return out


def _amount(consumed: Mapping[str, Any], name: str, unit: int) -> str:
    if name not in consumed:
        return "?"
    try:
        return str(-(-parse_quantity(consumed[name]) // unit))
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
    uuids: Mapping[DeviceKey, str],
    model_of: Callable[[str], str],
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
        for entry in map(_map, _list(_map(container.get("resources")).get("claims"))):
            claim = claims.get(made.get(str(entry.get("name")), ""))
            wanted = entry.get("request")
            for result in _results(claim or {}, str(wanted) if wanted else None):
                key = (
                    str(result.get("driver")),
                    str(result.get("pool")),
                    str(result.get("device")),
                )
                uuid = uuids.get(key, "?")
                consumed = _map(result.get("consumedCapacity"))
                lines.append(
                    [
                        who,
                        request,
                        node,
                        uuid,
                        model_of(uuid).removeprefix("NVIDIA-") if uuid != "?" else "?",
                        _amount(consumed, "memory", MIB),
                        _amount(consumed, "cores", 1),
                        SHARED_AS,
                        status,
                    ]
                )
    if not lines:
        lines.append([name, request, node, "-", "-", "-", "-", "-", status])
    for line in lines[1:]:
        line[1] = ""  # the request once per pod
    return lines


def placement_rows(
    pods: Mapping[str, Mapping[str, Any]],
    order: Sequence[tuple[str, str]],
    claims: Mapping[str, Mapping[str, Any]],
    uuids: Mapping[DeviceKey, str],
    model_of: Callable[[str], str],
) -> list[list[str]]:
    """The header and every pod's rows, in ``order`` ((name, request) pairs)."""
    rows = [list(HEADER)]
    for name, request in order:
        pod = pods.get(name)
        if pod is None:
            rows.append([name, request, "-", "-", "-", "-", "-", "-", "missing"])
            continue
        rows.extend(pod_rows(name, request, pod, claims, uuids, model_of))
    return rows
