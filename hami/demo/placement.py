"""The extender demo's placement table: one row per device a container got, with how the
device is shared (HAMi-core, the MIG profile of its instance, the Ascend vNPU template).

Read from what the pods carry: the scheduler's ``hami.io/{type}-devices-allocated``
decision, the MIG reservation ``hami.io/vgpu-mig-allocations`` and the Ascend runtime value
``huawei.com/{type}``. A value that cannot be read shows ``?`` in its cell.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hami.kube.objects import annotations_of
from hami.protocol import ContainerDevice, ProtocolError, decode_pod_devices, keys
from hami.protocol.mig import decode_mig_allocations

HEADER = [
    "POD",
    "REQUEST",
    "NODE",
    "DEVICE",
    "MODEL",
    "MEMORY MiB",
    "CORES %",
    "SHARED AS",
    "STATUS",
]
#: the decision key of a device type: ``vgpu`` is NVIDIA's
_ALLOCATED = re.compile(r"^hami\.io/(?P<word>[^/]+)-devices-allocated$")


def table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns, two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def status_of(pod: Mapping[str, Any]) -> str:
    """The pod's phase; ``Bound`` for one on a node that nothing starts; the bind phase
    when the node agent has not finished it."""
    spec = pod.get("spec") or {}
    phase = str((pod.get("status") or {}).get("phase") or "Pending")
    if phase == "Pending" and spec.get("nodeName"):
        return "Bound"
    bind = annotations_of(pod).get(keys.BIND_PHASE)
    if bind and bind != "success" and phase != "Pending":
        return f"{phase} ({bind})"
    return phase


def decisions(pod: Mapping[str, Any]) -> list[tuple[str, list[list[ContainerDevice]]]]:
    """(type word, devices per container) of every device type the pod was given."""
    out = []
    for key, value in sorted(annotations_of(pod).items()):
        match = _ALLOCATED.match(key)
        if match is None:
            continue
        try:
            out.append((match["word"], decode_pod_devices(value)))
        except ProtocolError:
            continue
    return out


def mig_instances(pod: Mapping[str, Any]) -> dict[tuple[int, int], tuple[str, str]]:
    """(container index, device index) -> (the MIG profile reserved for it, the UUID of the
    instance the node made for it, ``""`` until it did)."""
    value = annotations_of(pod).get(keys.MIG_ALLOCATIONS)
    if value is None:
        return {}
    try:
        found = decode_mig_allocations(value)
    except ProtocolError:
        return {}
    return {(a.container_index, a.device_index): (a.profile, a.mig_uuid) for a in found}


def ascend_templates(pod: Mapping[str, Any], word: str) -> dict[str, str]:
    """Chip UUID -> the vNPU template in the pod's ``huawei.com/{word}`` runtime value."""
    value = annotations_of(pod).get(f"huawei.com/{word}")
    if value is None:
        return {}
    try:
        entries = json.loads(value)
    except ValueError:
        return {}
    if not isinstance(entries, list):
        return {}
    return {
        str(e.get("UUID")): str(e.get("temp") or "whole chip")
        for e in entries
        if isinstance(e, dict)
    }


def _shared_as(
    word: str, container: int, index: int, device: ContainerDevice, pod: Mapping[str, Any]
) -> tuple[str, str]:
    """How the device is shared, and what the container sees of it (a MIG instance's UUID
    once the node made it, else the device's)."""
    if word == "vgpu":
        profile, mig_uuid = mig_instances(pod).get((container, index), ("", ""))
        if profile:
            return f"MIG {profile}", mig_uuid or device.uuid
        return "HAMi-core", device.uuid
    if word.startswith("Ascend"):
        return f"vNPU {ascend_templates(pod, word).get(device.uuid, '?')}", device.uuid
    return word, device.uuid


def pod_rows(
    name: str, request: str, pod: Mapping[str, Any], model_of: Callable[[str], str]
) -> list[list[str]]:
    """The rows of one pod: one per device of each container (init containers first)."""
    spec = pod.get("spec") or {}
    node = str(spec.get("nodeName") or "-")
    status = status_of(pod)
    init = [c["name"] for c in spec.get("initContainers") or []]
    names = init + [c["name"] for c in spec.get("containers") or []]
    lines: list[list[str]] = []
    for word, entries in decisions(pod) if node != "-" else []:
        for position, (cname, devices) in enumerate(zip(names, entries, strict=False)):
            for index, device in enumerate(devices):
                label = f"{cname} (init)" if cname in init else cname
                who = name if len(names) == 1 else f"{name}/{label}"
                shared, seen = _shared_as(word, position, index, device, pod)
                lines.append(
                    [
                        who,
                        request,
                        node,
                        seen,
                        model_of(device.uuid).removeprefix("NVIDIA-"),
                        str(device.memory),
                        str(device.cores),
                        shared,
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
    model_of: Callable[[str], str],
) -> list[list[str]]:
    """The header and every pod's rows, in ``order`` ((name, request) pairs)."""
    rows = [list(HEADER)]
    for name, request in order:
        pod = pods.get(name)
        if pod is None:
            rows.append([name, request, "-", "-", "-", "-", "-", "-", "missing"])
            continue
        rows.extend(pod_rows(name, request, pod, model_of))
    return rows
