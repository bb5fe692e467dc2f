"""Preparing a claim on MIG partitions (``hami.dra.migslices``): the exact GPU instance and
compute instance each allocated partition names, made (or adopted) through the extender
mode's ``MigInstances`` (recorded in its ledger before NVML is asked, so a restarted agent
adopts what it made), answered through CDI with the MIG devices' UUIDs, and destroyed again
on unprepare.

The instances belong to the claim (the ledger's owner uid is the claim uid): they live from
the claim's first prepare on the node to its unprepare, whichever pods share it. kube-scheduler
only allocates partitions whose memory slices are free (the counters), but the allocation is
still API input: a result naming another node's pool, a device that is not a partition of
this node, a device twice, or admin access is refused with the claim named.

Blocks on NVML: run ``prepare_mig_claim`` and ``release_claim`` in a worker thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami.backends.base import Backend, ContainerAllocation, Device
from hami.backends.mig_instances import MigInstances, Owner, Realised
from hami.dra import cdi, migslices, names
from hami.dra.claims import ClaimAllocation, ClaimError, claim_ref, driver_results
from hami.dra.groups import base_request, container_requests, request_groups
from hami.dra.migslices import Partition
from hami.dra.prepare import Group, Prepared, group_names
from hami.protocol.mig import MigAllocation

JSON = dict[str, Any]
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"


@dataclass(frozen=True, slots=True)
class MigResult:
    """One allocation result of this driver on a MIG partition."""

    request: str
    device: str
    share_id: str | None
    partition: Partition


def instances_of(backend: Backend) -> MigInstances | None:
    mig = getattr(backend, "mig", None)
    return mig if isinstance(mig, MigInstances) else None


def serves_mig(backend: Backend, devices: Sequence[Device]) -> bool:
    """Whether this backend's devices are published as MIG partitions."""
    return instances_of(backend) is not None and migslices.partitioned(devices)


def mig_results(
    claim: Mapping[str, Any],
    *,
    uid: str,
    node: str,
    backend: Backend,
    node_devices: Sequence[Device],
) -> list[MigResult]:
    """This driver's results of ``claim``, each on a partition of this node. Raises
    ClaimError naming the claim."""
    where, mine = driver_results(claim, uid, backend.type_word)
    parts = migslices.partitions(backend.type_word, node_devices)
    out: list[MigResult] = []
    for i, result in enumerate(mine):
        at = f"{where} result {i} ({result.get('request', '?')})"
        if result.get("pool") != node:
            raise ClaimError(
                f"{at}: pool {result.get('pool')!r} is not this node's pool {node!r}; "
                "the claim was allocated for another node"
            )
        name = str(result.get("device"))
        partition = parts.get(name)
        if partition is None:
            raise ClaimError(
                f"{at}: device {name!r} is not a MIG partition of this node (its GPUs are "
                "in MIG mode and published as nvidia-<index>-mig-<profile>-<start>)"
            )
        if result.get("adminAccess") is True:
            raise ClaimError(
                f"{at}: admin access to a MIG partition is not supported (the instance "
                "belongs to the claim that holds it); ask for the partition without adminAccess"
            )
        if any(r.device == name for r in out):
            raise ClaimError(f"{at}: device {name!r} is allocated twice in one claim")
        share = result.get("shareID")
        out.append(MigResult(str(result.get("request", "")), name, share and str(share), partition))
    return out


def _pod_uid(claim: Mapping[str, Any], fallback: str) -> str:
    for ref in (claim.get("status") or {}).get("reservedFor") or []:
        if isinstance(ref, Mapping) and ref.get("resource") == "pods" and ref.get("uid"):
            return str(ref["uid"])
    return fallback


def prepare_mig_claim(
    claim: Mapping[str, Any],
    *,
    uid: str,
    node: str,
    backend: Backend,
    node_devices: Sequence[Device],
    pods: Sequence[Mapping[str, Any]] = (),
) -> Prepared:
    """Make (or adopt) every allocated partition's instance, then the CDI spec: one CDI
    device per group of requests the containers use together, its MIG UUIDs visible.
    Instances made here are destroyed again when a later one fails. Raises ClaimError or
    BackendError."""
    instances = instances_of(backend)
    if instances is None:
        raise ClaimError(
            f"{claim_ref(claim)}: the {backend.type_word} backend makes no MIG instances"
        )
    results = mig_results(claim, uid=uid, node=node, backend=backend, node_devices=node_devices)
    meta = claim.get("metadata") or {}
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    owner = Owner(uid, f"claim {namespace}/{name}")
    done: list[Realised] = []
    try:
        for i, r in enumerate(results):
            p = r.partition
            want = MigAllocation(0, i, p.gpu.uuid, p.profile.name, p.placement)
            done.append(instances.realise(want, owner))
    except BaseException:
        instances.release(x.entry for x in done if x.created)
        raise
    uuids = [x.allocation.mig_uuid for x in done]
    requests = [base_request(r.request) for r in results]
    used = [s for pod in pods for s in container_requests(pod, name, requests)]
    split = request_groups(requests, used)
    holder = ClaimAllocation(namespace, name, uid, _pod_uid(claim, uid), ())
    driver = names.driver_name(backend.type_word)
    groups: list[Group] = []
    for members in split:
        cdi_name, container = group_names(holder, members, whole=len(split) == 1)
        visible = [u for u, req in zip(uuids, requests, strict=True) if req in members]
        allocation = ContainerAllocation(envs={VISIBLE_DEVICES: ",".join(visible)})
        groups.append(Group(members, cdi_name, container, allocation))
    by_request = {req: g for g in groups for req in g.requests}
    devices: list[JSON] = []
    seen: set[str] = set()
    for r, req in zip(results, requests, strict=True):
        entry: JSON = {
            "requestNames": [req],
            "poolName": node,
            "deviceName": r.device,
            "cdiDeviceIds": []
            if req in seen
            else [names.cdi_device_id(driver, by_request[req].cdi_name)],
        }
        seen.add(req)
        if r.share_id:
            entry["shareId"] = r.share_id
        devices.append(entry)
    spec = cdi.cdi_spec(driver, [(g.cdi_name, g.allocation) for g in groups])
    return Prepared(spec=spec, groups=tuple(groups), devices=devices)


def release_claim(backend: Backend, uid: str) -> list[str]:
    """Destroy the instances made for the claim ``uid``; what could not be and why. No NVML
    call when it holds none."""
    instances = instances_of(backend)
    if instances is None:
        return []
    held = [e for e in instances.ledger if e.pod_uid == uid]
    if not held:
        return []
    return instances.remove(held, "its claim was unprepared")
