"""The NVIDIA backend's answer to kubelet on a node in ``operating_mode: mig``, and the pods
the reconciler keeps instances for.

A container's devices are its reservations in ``hami.io/vgpu-mig-allocations`` (those with
its ``containerIndex``, by ``deviceIndex``; each on the GPU its devices value names, in
order). Each is realised (``MigInstances.realise``) and the container sees the MIG devices
by UUID in ``NVIDIA_VISIBLE_DEVICES``, as Go HAMi 2.10's plugin answers in MIG mode (no
HAMi-core: the instance is the limit). The completed reservations go back to the pod in
Go's bytes. When a later device of the container fails, the instances this call made are
destroyed again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hami.backends.base import AllocationRequest, BackendError, ContainerAllocation
from hami.backends.mig_instances import ActivePod, MigInstances, Owner, Realised
from hami.protocol import ProtocolError
from hami.protocol.mig import (
    MIG_ALLOCATIONS_KEY,
    MigAllocation,
    decode_mig_allocations,
    encode_mig_allocations,
)

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
_RESCHEDULE = (
    "delete the pod so that a scheduler that knows MIG (this project's or Go HAMi 2.10) "
    "places it again"
)
_TERMINAL = ("Succeeded", "Failed")


def _reservations(request: AllocationRequest) -> list[MigAllocation]:
    value = request.pod_annotations.get(MIG_ALLOCATIONS_KEY)
    if value is None:
        raise BackendError(
            f"no {MIG_ALLOCATIONS_KEY} on the pod: this node serves NVIDIA GPUs only as MIG "
            f"instances (operating_mode: mig) and nothing reserved one; {_RESCHEDULE}"
        )
    try:
        return decode_mig_allocations(value)
    except ProtocolError as exc:
        raise BackendError(str(exc)) from None


def container_reservations(
    request: AllocationRequest, allocations: Sequence[MigAllocation]
) -> list[MigAllocation]:
    """The container's reservations, one per device, in the devices' order."""
    mine = sorted(
        (a for a in allocations if a.container_index == request.container_index),
        key=lambda a: a.device_index,
    )
    if len(mine) != len(request.devices):
        raise BackendError(
            f"{MIG_ALLOCATIONS_KEY} reserves {len(mine)} MIG instance(s) for container "
            f"{request.container_index}, which was given {len(request.devices)} device(s); "
            f"{_RESCHEDULE}"
        )
    for reservation, device in zip(mine, request.devices, strict=True):
        if reservation.gpu_uuid != device.uuid:
            raise BackendError(
                f"{MIG_ALLOCATIONS_KEY} reserves device {reservation.device_index} of container "
                f"{request.container_index} on GPU {reservation.gpu_uuid}, the devices value "
                f"gives it GPU {device.uuid}; {_RESCHEDULE}"
            )
    return mine


def mig_allocation(request: AllocationRequest, instances: MigInstances) -> ContainerAllocation:
    """Realise the container's reservations; the answer and the completed annotation.
    Blocks on NVML. Raises BackendError."""
    allocations = _reservations(request)
    owner = Owner(request.pod_uid, f"{request.pod_namespace}/{request.pod_name}")
    done: list[Realised] = []
    try:
        for reservation in container_reservations(request, allocations):
            done.append(instances.realise(reservation, owner))
    except BaseException:
        instances.release(r.entry for r in done if r.created)
        raise
    completed = {(r.allocation.container_index, r.allocation.device_index): r for r in done}
    updated = [
        completed[(a.container_index, a.device_index)].allocation
        if (a.container_index, a.device_index) in completed
        else a
        for a in allocations
    ]
    return ContainerAllocation(
        envs={VISIBLE_DEVICES: ",".join(r.allocation.mig_uuid for r in done)},
        pod_annotations={MIG_ALLOCATIONS_KEY: encode_mig_allocations(updated)},
    )


def refuse_mig_reservation(request: AllocationRequest, mode: str = "hami-core") -> None:
    """On a node in ``hami-core`` (or ``mps``) mode: a container whose devices were reserved
    as MIG instances is refused (HAMi-core and MPS cannot honour them). An unreadable value
    is not this mode's concern."""
    value = request.pod_annotations.get(MIG_ALLOCATIONS_KEY)
    if not value:
        return
    try:
        allocations = decode_mig_allocations(value)
    except ProtocolError:
        return
    if any(a.container_index == request.container_index for a in allocations):
        raise BackendError(
            f"the pod reserves MIG instances ({MIG_ALLOCATIONS_KEY}) but this node's nvidia "
            f"backend runs operating_mode: {mode}, which makes no MIG instances; "
            "set operating_mode: mig on this node, or delete the pod to schedule it again"
        )


def active_pods(pods: Iterable[Mapping[str, Any]]) -> dict[str, ActivePod]:
    """The pods that may still run a container (uid -> ref and readable reservations): every
    listed pod but Succeeded and Failed ones. A terminating pod counts until it is gone, as its
    containers may still run on the instance."""
    active: dict[str, ActivePod] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        uid = meta.get("uid")
        if not isinstance(uid, str) or (pod.get("status") or {}).get("phase") in _TERMINAL:
            continue
        value = (meta.get("annotations") or {}).get(MIG_ALLOCATIONS_KEY)
        try:
            allocations = tuple(decode_mig_allocations(value)) if value else ()
        except ProtocolError:
            allocations = ()  # its instances stay: they are kept by the pod's uid
        active[uid] = ActivePod(f"{meta.get('namespace', '')}/{meta.get('name', '')}", allocations)
    return active
