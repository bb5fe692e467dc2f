"""One ResourceClaim's allocation for this driver and node, read and validated. Pure.

kube-scheduler wrote the allocation, but the claim's status is still input from the API
server: a result naming another node's pool, a device this node does not have, or consumed
capacity beyond the device is refused with a message naming the claim, exactly as the
extender path refuses a forged decision (the same ``check_entry`` rule runs on the result).

A result with ``adminAccess: true`` (Kubernetes' admin access: a monitoring or debugging
claim, allowed by kube-apiserver only in namespaces labelled
``resource.kubernetes.io/admin-access: "true"``) holds nothing: kube-scheduler gives it
devices already in use and does not count what it records as consumed. Such a result is
read for its device only; a claim mixing it with ordinary results of this driver is
refused, since one CDI device cannot give one device HAMi-core limits and another none.

The results are split into groups of requests that the claim's containers use together
(hami.dra.groups); the ``check_entry`` rule runs per group, as per container in the
extender mode: two requests on one shared device are fine in different containers, but
HAMi-core gives one container each device once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami.backends.base import Backend, Device
from hami.core.requests import parse_quantity
from hami.dra import names
from hami.dra.groups import base_request, container_requests, request_groups
from hami.protocol import ContainerDevice

MIB = 1 << 20

# hami.node.allocate.check_entry: (devices, backend, node devices, where) -> None, raising
# on a device this node cannot honestly serve. Passed in: hami.dra sits below hami.node.
EntryCheck = Callable[[Sequence[ContainerDevice], Backend, Sequence[Device], str], None]


class ClaimError(ValueError):
    """The claim cannot be prepared here; the message names the claim and the fix."""


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One allocation result of this driver: where kube-scheduler put it and what it took."""

    request: str
    pool: str
    device: str  # the device's name in the slice
    share_id: str | None
    slice: ContainerDevice  # uuid, vendor, MiB, cores: what HAMi-core enforces
    admin_access: bool = False  # monitoring access: no limits, not a tenant (memory 0)


@dataclass(frozen=True, slots=True)
class ClaimAllocation:
    namespace: str
    name: str
    uid: str
    pod_uid: str  # the pod the claim is reserved for (its HAMi-core directory), else uid
    devices: tuple[ClaimDevice, ...]
    # base request names, one tuple per CDI device (hami.dra.groups); () for one of all
    groups: tuple[tuple[str, ...], ...] = ()

    @property
    def admin_access(self) -> bool:
        """Every result is an admin-access one (mixed claims are refused on reading)."""
        return bool(self.devices) and all(d.admin_access for d in self.devices)


def driver_results(
    claim: Mapping[str, Any], uid: str, type_word: str
) -> tuple[str, list[Mapping[str, Any]]]:
    """The claim's name for errors and its allocation results for this type's driver,
    after checking it is the claim kubelet asked for and is allocated. Raises ClaimError
    naming the claim."""
    where = claim_ref(claim)
    meta = claim.get("metadata") or {}
    if meta.get("uid") != uid:
        raise ClaimError(
            f"{where}: uid {meta.get('uid')!r} is not the {uid!r} kubelet asked for "
            "(the claim was deleted and created again); kubelet retries with the new one"
        )
    driver = names.driver_name(type_word)
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, Mapping):
        raise ClaimError(f"{where}: not allocated; kube-scheduler allocates it before kubelet")
    results = (allocation.get("devices") or {}).get("results") or []
    mine = [r for r in results if isinstance(r, Mapping) and r.get("driver") == driver]
    if not mine:
        raise ClaimError(f"{where}: no allocation result for driver {driver}")
    return where, mine


def claim_ref(claim: Mapping[str, Any]) -> str:
    """A claim's name in errors."""
    meta = claim.get("metadata") or {}
    return f"ResourceClaim {meta.get('namespace', '?')}/{meta.get('name', '?')}"


def _mib(value: Any, where: str) -> int:
    try:
        amount = parse_quantity(value)
    except ValueError as exc:
        raise ClaimError(f"{where}: consumed memory {value!r} is not a quantity ({exc})") from None
    if amount % MIB:
        raise ClaimError(f"{where}: consumed memory {value!r} is not a whole number of MiB")
    return amount // MIB


def _cores(value: Any, where: str) -> int:
    try:
        return parse_quantity(value)
    except ValueError as exc:
        raise ClaimError(f"{where}: consumed cores {value!r} is not a number ({exc})") from None


def _pod_uid(claim: Mapping[str, Any], fallback: str) -> str:
    for ref in (claim.get("status") or {}).get("reservedFor") or []:
        if isinstance(ref, Mapping) and ref.get("resource") == "pods" and ref.get("uid"):
            return str(ref["uid"])
    return fallback


def _admin_requests(claim: Mapping[str, Any]) -> set[str]:
    """The names of the claim's requests that ask for admin access."""
    spec = claim.get("spec")
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    out: set[str] = set()
    for request in requests if isinstance(requests, list) else []:
        exactly = request.get("exactly") if isinstance(request, Mapping) else None
        if isinstance(exactly, Mapping) and exactly.get("adminAccess") is True:
            out.add(str(request.get("name", "")))
    return out


def claim_allocation(
    claim: Mapping[str, Any],
    *,
    uid: str,
    node: str,
    backend: Backend,
    node_devices: Sequence[Device],
    check: EntryCheck,
    pods: Sequence[Mapping[str, Any]] = (),
) -> ClaimAllocation:
    """This driver's results of ``claim``, validated against this node's devices, in groups
    by what the containers of ``pods`` (those it is reserved for) use together. Raises
    ClaimError (or the check's own error) naming the claim."""
    where, mine = driver_results(claim, uid, backend.type_word)
    meta = claim.get("metadata") or {}
    by_name = {names.device_name(backend.type_word, d.index): d for d in node_devices}
    admin_requests = _admin_requests(claim)
    out: list[ClaimDevice] = []
    for i, result in enumerate(mine):
        at = f"{where} result {i} ({result.get('request', '?')})"
        if result.get("pool") != node:
            raise ClaimError(
                f"{at}: pool {result.get('pool')!r} is not this node's pool {node!r}; "
                "the claim was allocated for another node"
            )
        device = by_name.get(str(result.get("device")))
        if device is None:
            raise ClaimError(
                f"{at}: device {result.get('device')!r} is not a {backend.type_word} device "
                f"of this node (its devices: {', '.join(sorted(by_name)) or 'none'})"
            )
        share = result.get("shareID")
        # only a literal true: anything else is an ordinary result and gets its limits
        if result.get("adminAccess") is True:
            if result.get("request") not in admin_requests:
                # the spec is immutable and kube-apiserver allowed adminAccess in it only
                # in a labelled namespace: a result without such a request is not believed
                raise ClaimError(
                    f"{at}: allocated with admin access, but the claim's request "
                    f"{result.get('request')!r} does not ask for it; not prepared"
                )
            # what kube-scheduler records as consumed is not held (it does not count it),
            # so none of it becomes a limit: memory and cores 0 pass the check below
            memory, cores, is_admin = 0, 0, True
        else:
            consumed = result.get("consumedCapacity")
            if not isinstance(consumed, Mapping) or "memory" not in consumed:
                raise ClaimError(
                    f"{at}: no consumed memory capacity; the device is shared "
                    "(allowMultipleAllocations) and kube-scheduler records what each claim takes"
                )
            memory = _mib(consumed["memory"], at)
            cores, is_admin = _cores(consumed.get("cores", 0), at), False
        out.append(
            ClaimDevice(
                request=str(result.get("request", "")),
                pool=node,
                device=str(result["device"]),
                share_id=str(share) if share else None,
                slice=ContainerDevice(
                    uuid=device.uuid, vendor=backend.vendor_word, memory=memory, cores=cores
                ),
                admin_access=is_admin,
            )
        )
    if len({d.admin_access for d in out}) > 1:
        requests = sorted({d.request for d in out if d.admin_access})
        raise ClaimError(
            f"{where}: mixes admin-access requests ({', '.join(requests)}) with ordinary "
            "ones; one claim gets either HAMi-core limits or none: put the admin-access "
            "requests in a claim of their own"
        )
    name = str(meta.get("name", ""))
    requests = [base_request(d.request) for d in out]
    used = [s for pod in pods for s in container_requests(pod, name, requests)]
    groups = request_groups(requests, used)
    for group in groups:
        at = where if len(groups) == 1 else f"{where} requests {'+'.join(group)}"
        check([d.slice for d in out if base_request(d.request) in group], backend, node_devices, at)
    return ClaimAllocation(
        namespace=str(meta.get("namespace", "")),
        name=name,
        uid=uid,
        pod_uid=_pod_uid(claim, uid),
        devices=tuple(out),
        groups=tuple(groups),
    )
