"""From a validated claim allocation to the CDI spec and the devices prepare returns. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hami.backends.base import AllocationRequest, Backend, ContainerAllocation, Device
from hami.dra import cdi, names
from hami.dra.claims import ClaimAllocation
from hami.dra.groups import base_request

JSON = dict[str, Any]
NAME_MAX = 255  # bytes in one directory name (Linux)


@dataclass(frozen=True, slots=True)
class Group:
    """One CDI device of the claim: the requests it gives a container, its CDI device name
    and the HAMi-core directory name after the pod uid (``{pod uid}_{container}``)."""

    requests: tuple[str, ...]
    cdi_name: str
    container: str
    allocation: ContainerAllocation


@dataclass(frozen=True, slots=True)
class Prepared:
    spec: JSON  # the CDI spec file's content: one device per group
    groups: tuple[Group, ...]
    devices: list[JSON]  # per result: requestNames, poolName, deviceName, cdiDeviceIds, shareId

    @property
    def host_dirs(self) -> list[str]:
        return [d for g in self.groups for d in g.allocation.host_dirs]


def group_names(claim: ClaimAllocation, requests: Sequence[str], whole: bool) -> tuple[str, str]:
    """(CDI device name, container part of the HAMi-core directory) of one group. A group of
    every request keeps the names of one device per claim (``{claim uid}``,
    ``claim-{claim}``); others are ``{claim uid}-{first request}`` and
    ``claim-{claim}_{request}+{request}``: ``_`` and ``+`` are in neither a claim name (a
    DNS subdomain) nor a request name (a DNS label), so the monitor's label reads back as
    claim and requests. A name too long for a directory uses the claim uid instead."""
    if whole:
        container = f"claim-{claim.name}"
        cdi_name = claim.uid
    else:
        container = f"claim-{claim.name}_{'+'.join(requests)}"
        cdi_name = f"{claim.uid}-{requests[0]}"
    if len(f"{claim.pod_uid}_{container}".encode()) > NAME_MAX:
        container = f"claim-{claim.uid}_{requests[0]}"
    return cdi_name, container


def prepare_claim(claim: ClaimAllocation, backend: Backend, node_devices: list[Device]) -> Prepared:
    """The backend's Allocate answer for each group of the claim's requests (hami.dra.groups:
    the requests its containers use together) as one CDI device: the env and mounts the
    extender path gives a container with those slices, and a HAMi-core directory of its
    own. An admin-access claim gets the backend's ``admin_allocation`` instead: the devices
    visible, no HAMi-core limits, no directory (docs/dra.md "Admin access")."""
    split = list(claim.groups) or [
        tuple(dict.fromkeys(base_request(d.request) for d in claim.devices))
    ]
    driver = names.driver_name(backend.type_word)
    groups: list[Group] = []
    for members in split:
        cdi_name, container = group_names(claim, members, whole=len(split) == 1)
        request = AllocationRequest(
            pod_namespace=claim.namespace,
            pod_name=claim.name,
            pod_uid=claim.pod_uid,
            container_name=container,
            container_index=0,
            devices=[d.slice for d in claim.devices if base_request(d.request) in members],
            node_devices=node_devices,
        )
        allocation = (
            backend.admin_allocation(request) if claim.admin_access else backend.allocate(request)
        )
        groups.append(Group(members, cdi_name, container, allocation))
    by_request = {r: g for g in groups for r in g.requests}
    devices: list[JSON] = []
    seen: set[str] = set()
    for d in claim.devices:
        # the first device of each request names its group's CDI device: a container naming
        # the request gets it once per request it names (kubelet does not deduplicate ids;
        # the same device twice applies the same edits twice)
        base = base_request(d.request)
        cdi_id = names.cdi_device_id(driver, by_request[base].cdi_name)
        entry: JSON = {
            # the request a container names: kubelet matches it exactly, so a firstAvailable
            # result's "gpu/a100" is answered as "gpu" (as kubeletplugin's helper does)
            "requestNames": [base],
            "poolName": d.pool,
            "deviceName": d.device,
            "cdiDeviceIds": [] if base in seen else [cdi_id],
        }
        seen.add(base)
        if d.share_id:
            entry["shareId"] = d.share_id
        devices.append(entry)
    spec = cdi.cdi_spec(driver, [(g.cdi_name, g.allocation) for g in groups])
    return Prepared(spec=spec, groups=tuple(groups), devices=devices)
