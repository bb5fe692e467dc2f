"""From a validated claim allocation to the CDI spec and the devices prepare returns. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hami.backends.base import AllocationRequest, Backend, ContainerAllocation, Device
from hami.dra import cdi, names
from hami.dra.claims import ClaimAllocation

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Prepared:
    spec: JSON  # the CDI spec file's content
    allocation: ContainerAllocation  # the backend's answer (host_dirs to create)
    devices: list[JSON]  # per result: requestNames, poolName, deviceName, cdiDeviceIds, shareId


def prepare_claim(claim: ClaimAllocation, backend: Backend, node_devices: list[Device]) -> Prepared:
    """The backend's Allocate answer for the claim's slices, as one CDI device: the same
    env and mounts the extender path gives a container with these devices. The HAMi-core
    directory is named after the pod the claim is reserved for and the claim. An
    admin-access claim gets the backend's ``admin_allocation`` instead: the devices visible,
    no HAMi-core limits, no directory (docs/dra.md "Admin access")."""
    request = AllocationRequest(
        pod_namespace=claim.namespace,
        pod_name=claim.name,
        pod_uid=claim.pod_uid,
        container_name=f"claim-{claim.name}",
        container_index=0,
        devices=[d.slice for d in claim.devices],
        node_devices=node_devices,
    )
    allocation = (
        backend.admin_allocation(request) if claim.admin_access else backend.allocate(request)
    )
    driver = names.driver_name(backend.type_word)
    cdi_id = names.cdi_device_id(driver, claim.uid)
    devices: list[JSON] = []
    seen: set[str] = set()
    for d in claim.devices:
        # the claim is one CDI device; the first device of each request names it, so a
        # container using the request gets it once (kubelet does not deduplicate ids)
        entry: JSON = {
            "requestNames": [d.request],
            "poolName": d.pool,
            "deviceName": d.device,
            "cdiDeviceIds": [] if d.request in seen else [cdi_id],
        }
        seen.add(d.request)
        if d.share_id:
            entry["shareId"] = d.share_id
        devices.append(entry)
    return Prepared(
        spec=cdi.cdi_spec(driver, claim.uid, allocation), allocation=allocation, devices=devices
    )
