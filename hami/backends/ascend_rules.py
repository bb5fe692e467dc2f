"""Huawei Ascend NPU request rules and pod values as Go HAMi 2.10 applies them (issue 24).

Pure functions over one ``Chip`` (hami.backends.ascend_chips); ``AscendBackend`` hands them
to the scheduler (``request_rule``, ``pod_annotations``).

A container asks with ``huawei.com/{type}`` (devices), ``huawei.com/{type}-memory`` (MiB)
and ``huawei.com/{type}-core``. Without the pod annotation ``huawei.com/vnpu-mode:
hami-core`` a device is split by Huawei's vNPU templates (hard split): the memory is rounded
up to the smallest template holding it (absent: the whole chip), a share of several devices
is refused, and so is any core request (the template fixes the compute). With it (soft split
by HAMi-core) memory and cores are taken as asked. The Ascend 910C is allocated by 2-NPU
module: one device means one module, an odd count above one is refused.

With a decision the scheduler writes ``huawei.com/{type}``, the JSON list the node's
ascend-device-plugin reads: per device its UUID, the template name (hard split), memory and
cores, fields that are zero or empty left out.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence

from hami.backends.ascend_chips import Chip, trim_memory
from hami.core.requests import DeviceRequest, RequestError
from hami.protocol import ContainerDevice

VNPU_MODE = "huawei.com/vnpu-mode"  # pod annotation: hami-core asks for the soft split
HAMI_CORE = "hami-core"
NODE_HAMI_CORE = "hami-vnpu-core"  # node annotation: "true" where the soft split is offered
MODULE_NPUS = 2  # NPUs per Ascend 910C module
SOFT_SPLIT = frozenset({NODE_HAMI_CORE})  # what a soft-split pod needs a node to offer
_GO_ESCAPES = tuple((chr(c), f"\\u{c:04x}") for c in (0x3C, 0x3E, 0x26, 0x2028, 0x2029))


def soft_split(annotations: Mapping[str, str]) -> bool:
    """Whether the pod asks for HAMi-core's soft split instead of vNPU templates."""
    return annotations.get(VNPU_MODE) == HAMI_CORE


def pod_needs(annotations: Mapping[str, str]) -> frozenset[str]:
    """A soft-split pod needs a node that offers the soft split (``DeviceKind.pod_needs``)."""
    return SOFT_SPLIT if soft_split(annotations) else frozenset()


def node_offers(annotations: Mapping[str, str]) -> frozenset[str]:
    """The soft split where the node says ``hami-vnpu-core: "true"``, as Go's Fit reads it:
    any other value, or none (Go's chart default ``hamiVnpuCore: false``), offers none."""
    return SOFT_SPLIT if annotations.get(NODE_HAMI_CORE) == "true" else frozenset()


def request_rule(
    chip: Chip, request: DeviceRequest, annotations: Mapping[str, str], where: str
) -> DeviceRequest:
    """The request Go's webhook and scheduler derive for one container (``RequestRule``)."""
    names = chip.resources
    soft = soft_split(annotations)
    count = request.count
    if chip.super_pod:
        if count == 1:
            count = MODULE_NPUS  # one module, the smallest unit
        elif count % MODULE_NPUS:
            raise RequestError(
                f"{where}: {names.count} must be 1 or an even number, got {count}: "
                f"{chip.word} is allocated by {MODULE_NPUS}-NPU module"
            )
    if request.cores > 0 and not soft:
        raise RequestError(
            f"{where}: {names.cores} is only for the soft split: the vNPU template fixes the "
            f"compute; remove it, or annotate the pod {VNPU_MODE}: {HAMI_CORE}"
        )
    if request.memory_percentage is not None:  # no memory named: the whole chip
        memory = chip.memory_allocatable
    elif soft:
        memory = request.memory
    else:
        memory, _template = trim_memory(chip, request.memory)
        if memory <= 0:
            raise RequestError(
                f"{where}: {names.memory} {request.memory} is more than a {chip.word} holds "
                f"({chip.memory_capacity} MiB); ask for at most that"
            )
    if request.count > 1 and not soft and memory != chip.memory_allocatable:
        raise RequestError(
            f"{where}: a vNPU (a memory share, here {memory} MiB) is for one {chip.word} only; "
            f"ask for 1 device or for whole devices (no {names.memory})"
        )
    return dataclasses.replace(
        request,
        count=count,
        memory=memory,
        memory_percentage=None,
        module=MODULE_NPUS if chip.super_pod else 1,
    )


def runtime_info(
    chip: Chip,
    containers: Sequence[Sequence[ContainerDevice]],
    annotations: Mapping[str, str],
) -> dict[str, str]:
    """``huawei.com/{type}``: what the node's plug-in reads to create each device's vNPU."""
    if not containers:
        return {}
    soft = soft_split(annotations)
    entries: list[dict[str, object]] = []
    for devices in containers:
        for device in devices:
            entry: dict[str, object] = {"UUID": device.uuid}
            if not soft:
                entry["temp"] = trim_memory(chip, device.memory)[1]
            entry["memory"] = device.memory
            entry["core"] = device.cores
            entries.append({k: v for k, v in entry.items() if v not in ("", 0)})
    # Go marshals an empty list as null; its encoder escapes <, >, & and the two Unicode line
    # separators, as json.dumps does not.
    text = json.dumps(entries or None, separators=(",", ":"), ensure_ascii=False)
    for char, escaped in _GO_ESCAPES:
        text = text.replace(char, escaped)
    return {f"huawei.com/{chip.word}": text}
