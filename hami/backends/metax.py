"""MetaX GPUs, scheduler side only, as Go HAMi 2.10 models them (issue 24).

Go HAMi has two device types for MetaX, each a backend here under Go's name:

- ``Metax-GPU``: whole GPUs. Go reads no register value: MetaX's plug-in advertises the GPUs
  as ``metax-tech.com/gpu`` capacity and Go's scheduler rebuilds them from it
  (``devices_from_node``): ids ``<node>-metax-<i>``, one slot, 65536 MiB, 100 cores, NUMA
  0. A container asks with ``metax-tech.com/gpu``; each GPU it gets is whole. Go walks a
  node's GPUs from the last, and a pod whose earlier container holds a GPU gets no other.
- ``Metax-SGPU``: shared GPUs (sGPU). MetaX's plug-in writes the node's GPUs as JSON under
  ``metax-tech.com/node-gpu-devices`` (uuid, slots, compute, memory, NUMA, health, the QoS
  policy the GPU runs, its MetaLink zone). A container asks with ``metax-tech.com/sgpu``
  (GPUs), ``vmemory`` (GiB as a bare number, bytes with a unit; absent: the whole GPU) and
  ``vcore`` (absent: 100 %). The pod's ``metax-tech.com/sgpu-qos-policy`` (best-effort,
  fixed-share or burst-share; absent: best-effort) must match the policy of a GPU already in
  use, unless the container takes whole GPUs; ``sgpu-app-class`` must be online or offline
  and then asks for one GPU. Go walks the GPUs from the last. A decision also writes
  ``metax-tech.com/gpu-devices-allocated`` (MetaX's JSON: per container, each GPU's uuid,
  compute and vRam), which MetaX's plug-in reads.

The QoS policy a GPU reports travels as its ``mode`` (``NodeDevice.mode``). Not modelled:
the online/offline placement rules of ``sgpu-app-class`` (which need the pods on each GPU),
MetaLink zones for whole-GPU requests, the QoS a decision is about to switch a GPU to (Go
remembers it until the node reports it), ``metax-tech.com/predicate-time`` and Go's node
scores. This project has no node agent for MetaX.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami.backends.base import (
    ResourceNames,
)
from hami.backends.capacity import advertised, node_name
from hami.backends.schedulerside import SchedulerSideBackend
from hami.core.requests import NO_ANNOTATIONS, DeviceRequest, RequestError, parse_quantity
from hami.core.usage import DeviceState, Use
from hami.protocol import ContainerDevice, NodeDevice, ProtocolError
from hami.protocol.objects import annotations_of

GPU_RESOURCES = ResourceNames(count="metax-tech.com/gpu")
SGPU_RESOURCES = ResourceNames(
    count="metax-tech.com/sgpu",
    memory="metax-tech.com/vmemory",
    cores="metax-tech.com/vcore",
    memory_unit_mib=1024,
)
GPU_MIB = 65536  # a GPU's memory as Go counts it when it reads capacity
WHOLE = 100
NODE_DEVICES = "metax-tech.com/node-gpu-devices"
ALLOCATED = "metax-tech.com/gpu-devices-allocated"
QOS_POLICY = "metax-tech.com/sgpu-qos-policy"
APP_CLASS = "metax-tech.com/sgpu-app-class"
QOS_POLICIES = ("best-effort", "fixed-share", "burst-share")
APP_CLASSES = ("online", "offline")
_INT32_MAX = 2**31 - 1
_WHAT = "metax-tech.com/node-gpu-devices"


def gpu_id(node: str, index: int) -> str:
    """The id Go gives the GPU at ``index`` of a node it reads from capacity."""
    return f"{node}-metax-{index}"


def gpus_from_capacity(node: Mapping[str, Any]) -> list[NodeDevice] | None:
    """The whole GPUs ``metax-tech.com/gpu`` capacity advertises, None when none."""
    count = advertised(node, GPU_RESOURCES.count)
    if count is None:
        return None
    node_id = node_name(node)
    return [
        NodeDevice(
            uuid=gpu_id(node_id, index),
            count=1,
            memory=GPU_MIB,
            cores=WHOLE,
            model="Metax-GPU",
            numa=0,
            healthy=True,
            index=index,
        )
        for index in range(count)
    ]


def _int32(entry: Mapping[str, Any], field: str) -> int:
    value = entry.get(field, 0)
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > _INT32_MAX:
        raise ProtocolError(_WHAT, f"{field} is not a 32-bit whole number", repr(value)[:100])
    return value


def _text(entry: Mapping[str, Any], field: str) -> str:
    value = entry.get(field, "")
    if not isinstance(value, str):
        raise ProtocolError(_WHAT, f"{field} is not a string", repr(value)[:100])
    return value


def sgpus_from_annotation(value: str) -> list[NodeDevice] | None:
    """The GPUs of MetaX's ``node-gpu-devices`` JSON, None when it lists none."""
    try:
        entries = json.loads(value)
    except (ValueError, RecursionError):
        raise ProtocolError(_WHAT, "not JSON", value[:100]) from None
    if entries is None:
        return None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ProtocolError(_WHAT, "not a list of objects", value[:100])
    devices = []
    for index, entry in enumerate(entries):
        healthy = entry.get("healthy", False)
        if not isinstance(healthy, bool):
            raise ProtocolError(_WHAT, "healthy is not true or false", repr(healthy)[:100])
        qos = _text(entry, "qosPolicy")
        _int32(entry, "linkZone")
        device = NodeDevice(
            uuid=_text(entry, "uuid"),
            count=_int32(entry, "totalDevCount"),
            memory=_int32(entry, "totalVRam"),
            cores=_int32(entry, "totalCompute"),
            model="Metax-SGPU",
            numa=_int32(entry, "numa"),
            healthy=healthy,
            index=index,
        )
        devices.append(dataclasses.replace(device, mode=qos) if qos else device)
    return devices or None


def _positions(devices: Sequence[DeviceState], fits: Sequence[bool], count: int) -> list[int]:
    """The first ``count`` fitting devices walking the list from the last, as Go does."""
    return [p for p in reversed(range(len(devices))) if fits[p]][:count]


def pick_whole(
    devices: Sequence[DeviceState],
    fits: Sequence[bool],
    request: DeviceRequest,
    overlay: Mapping[str, Use],
) -> list[int] | None:
    """``Metax-GPU``: from the last GPU; none when an earlier container holds one."""
    if any(use.slots > 0 for use in overlay.values()):
        return None
    chosen = _positions(devices, fits, request.count)
    return chosen if len(chosen) == request.count else None


def device_qos(device: DeviceState) -> str:
    """The QoS policy the GPU reports ("" when none), carried as its mode."""
    return device.mode if device.mode in QOS_POLICIES else ""


@dataclass(frozen=True, slots=True)
class QosPick:
    """``Metax-SGPU``: from the last GPU, each in use one only where its QoS policy is the
    pod's (or it reports none), unless the request takes whole GPUs."""

    qos: str

    def __call__(
        self,
        devices: Sequence[DeviceState],
        fits: Sequence[bool],
        request: DeviceRequest,
        overlay: Mapping[str, Use],
    ) -> list[int] | None:
        def qos_ok(device: DeviceState) -> bool:
            extra = overlay.get(device.uuid)
            if device.used + (extra.slots if extra else 0) == 0 or request.cores == WHOLE:
                return True
            return device_qos(device) in ("", self.qos)

        matching = [ok and qos_ok(d) for d, ok in zip(devices, fits, strict=True)]
        chosen = _positions(devices, matching, request.count)
        return chosen if len(chosen) == request.count else None


def read_vmemory(value: Any) -> int:
    """``vmemory`` in MiB: a bare number is GiB, a number with a unit bytes (rounded down
    to MiB)."""
    amount = parse_quantity(value)
    if any(c.isalpha() for c in str(value).strip()):
        return amount // (1024 * 1024)
    return amount * SGPU_RESOURCES.memory_unit_mib


def sgpu_request_rule(
    request: DeviceRequest, annotations: Mapping[str, str], where: str
) -> DeviceRequest:
    """The refusals of Go's webhook (app class, QoS policy) and the pod's QoS for Fit."""
    app_class = annotations.get(APP_CLASS)
    if app_class is not None:
        if app_class not in APP_CLASSES:
            raise RequestError(f"{where}: {APP_CLASS} must be one of {', '.join(APP_CLASSES)}")
        if request.count != 1:
            raise RequestError(f"{where}: an {APP_CLASS} pod must ask for one device")
    qos = annotations.get(QOS_POLICY, QOS_POLICIES[0])
    if app_class != "online" and qos not in QOS_POLICIES:
        raise RequestError(f"{where}: {QOS_POLICY} must be one of {', '.join(QOS_POLICIES)}")
    return dataclasses.replace(request, pick=QosPick(qos))


def allocated_value(containers: Sequence[Sequence[ContainerDevice]]) -> str:
    """``metax-tech.com/gpu-devices-allocated``: MetaX's JSON of a decision."""
    value = [
        [
            {
                "uuid": d.uuid,
                **({"compute": d.cores} if d.cores else {}),
                **({"vRam": d.memory} if d.memory else {}),
            }
            for d in devices
        ]
        for devices in containers
    ]
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


class _MetaxBackend(SchedulerSideBackend):
    vendor = "MetaX"
    node_plugin = "MetaX's device plug-in"
    known_options = frozenset()
    default_cores = WHOLE

    fixed_resources = True

    @property
    def selector_keys(self) -> tuple[tuple[str, str], ...]:
        return (
            ("use-uuid", "metax-tech.com/use-gpuuuid"),
            ("nouse-uuid", "metax-tech.com/nouse-gpuuuid"),
        )


class MetaxGpuBackend(_MetaxBackend):
    """Whole MetaX GPUs (Go's ``Metax-GPU`` type)."""

    type_word = "Metax-GPU"
    plugin_does = f"advertises {GPU_RESOURCES.count}"
    vendor_word = "Metax-GPU"
    default_resources = GPU_RESOURCES
    allocated_key = "hami.io/metax-gpu-devices-allocated"
    to_allocate_key = "hami.io/metax-gpu-devices-to-allocate"
    node_lock = False  # Go's LockNode does nothing; MetaX's plug-in releases no lock

    def devices_from_node(self, node: Mapping[str, Any]) -> list[NodeDevice] | None:
        return gpus_from_capacity(node)

    def request_rule(
        self, request: DeviceRequest, annotations: Mapping[str, str], where: str
    ) -> DeviceRequest:
        """Whole GPUs, from the last."""
        return dataclasses.replace(
            request, memory=0, memory_percentage=WHOLE, cores=WHOLE, pick=pick_whole
        )


class MetaxSgpuBackend(_MetaxBackend):
    """Shared MetaX GPUs (Go's ``Metax-SGPU`` type)."""

    type_word = "Metax-SGPU"
    plugin_does = f"writes {NODE_DEVICES}"
    vendor_word = "Metax-SGPU"
    default_resources = SGPU_RESOURCES
    allocated_key = "hami.io/metax-sgpu-devices-allocated"
    to_allocate_key = "hami.io/metax-sgpu-devices-to-allocate"

    def devices_from_node(self, node: Mapping[str, Any]) -> list[NodeDevice] | None:
        value = annotations_of(node).get(NODE_DEVICES)
        return None if value is None else sgpus_from_annotation(value)

    def read_memory(self, value: Any) -> int:
        return read_vmemory(value)

    def request_rule(
        self, request: DeviceRequest, annotations: Mapping[str, str], where: str
    ) -> DeviceRequest:
        return sgpu_request_rule(request, annotations, where)

    def pod_annotations(
        self,
        containers: Sequence[Sequence[ContainerDevice]],
        index_of: Callable[[str], int],
        annotations: Mapping[str, str] = NO_ANNOTATIONS,
    ) -> dict[str, str]:
        return {ALLOCATED: allocated_value(containers)}
