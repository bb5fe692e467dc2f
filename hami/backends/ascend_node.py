"""What an Ascend node agent writes and answers, as HAMi's ascend-device-plugin does, so Go
HAMi's scheduler and this one read it alike (the node side of hami.backends.ascend).

- Register value ``hami.io/node-register-{type}``: Go's JSON of its device list (fields in
  Go's struct order, zero values left out): per chip its uuid, index, the vNPUs of the
  smallest template as ``count``, the chart's memory and AI cores, the type, health, and a
  ``NetworkID`` on 910 types (1 from the fifth chip on, 0 on the 910C).
- ``hami-vnpu-core: "false"``: this agent offers only Huawei's vNPU templates (the hard
  split); HAMi's soft split needs its closed ``hami-vnpu-core`` library, so Go's scheduler
  keeps ``huawei.com/vnpu-mode: hami-core`` pods off the node.
- Allocate: ``ASCEND_VISIBLE_DEVICES`` (the chips' physical ids, what Ascend Docker Runtime
  mounts as ``/dev/davinci<id>``) and, for a vNPU, ``ASCEND_VNPU_SPECS`` (the template
  name from the pod's ``huawei.com/{type}``, which the runtime creates the vNPU from).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from hami.backends.ascend_chips import Chip
from hami.backends.ascend_rules import NODE_HAMI_CORE, soft_split
from hami.backends.base import BackendError, ContainerAllocation
from hami.protocol import ContainerDevice, NodeDevice

VISIBLE_DEVICES = "ASCEND_VISIBLE_DEVICES"
VNPU_SPECS = "ASCEND_VNPU_SPECS"
NODE_ANNOTATIONS = {NODE_HAMI_CORE: "false"}
_NETWORK_PREFIX = "Ascend910"
_CHIPS_PER_NETWORK = 4  # the plug-in: chips 0-3 are network 0, the rest network 1


def register_value(chip: Chip, devices: Sequence[NodeDevice]) -> str:
    entries: list[dict[str, Any]] = []
    for i, device in enumerate(devices):
        entry: dict[str, Any] = {"id": device.uuid}
        if i:
            entry["index"] = i
        entry.update(count=device.count, devmem=device.memory, devcore=device.cores)
        entry["type"] = chip.word
        if device.healthy:
            entry["health"] = True
        if chip.word.startswith(_NETWORK_PREFIX):
            network = 0 if chip.super_pod else int(i >= _CHIPS_PER_NETWORK)
            entry["custominfo"] = {"NetworkID": network}
        entries.append({k: v for k, v in entry.items() if v not in (0, "")})
    return json.dumps(entries, separators=(",", ":"))


def allocation(
    chip: Chip,
    devices: Sequence[ContainerDevice],
    physical: Mapping[str, int],
    annotations: Mapping[str, str],
    where: str,
) -> ContainerAllocation:
    """The answer for one container given ``devices`` (uuid -> physical id in
    ``physical``); ``annotations`` are the pod's, ``where`` names pod and container."""
    if not devices:
        raise BackendError(f"{where}: no {chip.word} to allocate")
    if soft_split(annotations):
        raise BackendError(
            f"{where}: the pod asks for HAMi's soft split (huawei.com/vnpu-mode: hami-core), "
            f"which this node agent does not offer (it writes {NODE_HAMI_CORE}: false); "
            f"remove the annotation to get a vNPU template, or run HAMi's ascend-device-plugin "
            f"with hami-vnpu-core on this node"
        )
    ids: list[str] = []
    for device in devices:
        phy = physical.get(device.uuid)
        if phy is None:
            known = ", ".join(sorted(physical)) or "none"
            raise BackendError(
                f"{where}: device {device.uuid} is not a {chip.word} of this node (known: {known})"
            )
        ids.append(str(phy))
    envs = {VISIBLE_DEVICES: ",".join(ids)}
    template = _template(chip, devices, annotations, where)
    if template:
        envs[VNPU_SPECS] = template
    return ContainerAllocation(envs=envs)


def _template(
    chip: Chip, devices: Sequence[ContainerDevice], annotations: Mapping[str, str], where: str
) -> str:
    """The first template named for one of ``devices`` in ``huawei.com/{type}`` (as the
    plug-in takes it), checked against the chart's templates for the chip."""
    key = chip.resources.count
    raw = annotations.get(key)
    fix = "the value comes from the HAMi scheduler: delete the pod and create it again"
    if raw is None:
        raise BackendError(f"{where}: the pod has no {key} annotation; {fix}")
    try:
        entries = json.loads(raw)
    except ValueError as exc:
        raise BackendError(f"{where}: {key} is not JSON ({exc}); {fix}") from None
    if entries is None:
        entries = []  # Go writes an empty list as null
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise BackendError(f"{where}: {key} must be a JSON list of objects, got {raw[:200]!r}")
    wanted = {d.uuid for d in devices}
    names = {t.name for t in chip.templates}
    for entry in entries:
        if entry.get("UUID") not in wanted:
            continue
        temp = entry.get("temp", "")
        if not isinstance(temp, str):
            raise BackendError(f"{where}: {key}: temp must be a string, got {temp!r}; {fix}")
        if temp and temp not in names:
            raise BackendError(
                f"{where}: {key} names vNPU template {temp!r}, not one of {chip.word}'s "
                f"({', '.join(sorted(names)) or 'none'}); {fix}"
            )
        if temp:
            return temp
    return ""
